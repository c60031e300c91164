"""Options shared by every command: the database target and ``--json``.

Both are accepted before the command name (``relay-flow-projection --json
status``) and after it (``relay-flow-projection status --json``); the one
after the command wins. Nothing here imports SQLAlchemy: ``--help`` must
start fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# The same values as relay_flow_projection.engine.DEFAULT_URL and
# migration_env.URL_ENVIRONMENT_VARIABLE (tests/test_cli.py checks), written
# out so that importing the command line does not import the engine.
DEFAULT_URL = "sqlite:///relay-flow.db"
URL_ENVIRONMENT_VARIABLE = "RELAY_FLOW_DATABASE_URL"

DB_HELP = (
    "Database: a SQLite file path or a SQLAlchemy URL "
    f"[default: ${URL_ENVIRONMENT_VARIABLE}, else {DEFAULT_URL}]"
)
JSON_HELP = "Print JSON (keys are documented in the README; times are ISO-8601 UTC)."


@dataclass
class Settings:
    """What the group-level options decided; commands read it through ``pass_settings``."""

    target: str
    as_json: bool = False


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


def global_json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(f)


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


def _json_or_global(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    settings = ctx.find_object(Settings)
    return value or (settings is not None and settings.as_json)


def json_option(f: F) -> F:
    """``--json`` after the command name; also true when given before it."""
    return click.option(
        "--json", "as_json", is_flag=True, callback=_json_or_global, help=JSON_HELP
    )(f)
