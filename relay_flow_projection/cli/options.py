"""Options shared by every command: the database target and ``--json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from ..engine import DEFAULT_URL
from ..migration_env import URL_ENVIRONMENT_VARIABLE

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = (
    "Database: a SQLite file path or a SQLAlchemy URL "
    f"[default: ${URL_ENVIRONMENT_VARIABLE}, else {DEFAULT_URL}]"
)


@dataclass
class Settings:
    """What the group-level options decided; commands read it through ``pass_settings``."""

    target: str


pass_settings = click.make_pass_decorator(Settings)


def _non_empty(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("the database target must not be empty")
    return value


def _check_target(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    return _non_empty(value) or DEFAULT_URL


def global_db_option(f: F) -> F:
    """The group's ``--db``, falling back on the environment, then the embedded default."""
    return click.option(
        "--db",
        "target",
        envvar=URL_ENVIRONMENT_VARIABLE,
        default=DEFAULT_URL,
        metavar="TARGET",
        callback=_check_target,
        help=DB_HELP,
    )(f)


def _override_target(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if _non_empty(value) is not None:
        ctx.ensure_object(Settings).target = str(value)


def db_option(f: F) -> F:
    """``--db`` after the command name too (``relay-flow-projection status --db X``)."""
    return click.option(
        "--db",
        metavar="TARGET",
        expose_value=False,
        callback=_override_target,
        help="Database (overrides the --db given before the command).",
    )(f)


def json_option(f: F) -> F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print JSON (keys are documented in the README; times are ISO-8601 UTC).",
    )(f)
