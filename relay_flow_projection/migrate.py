"""Running the Alembic chain programmatically, and asking where a database stands."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection

from .engine import ResolvedTarget, Target, resolve_target
from .errors import SchemaOutOfDate
from .migration_env import TARGET_ATTRIBUTE

_PACKAGE_DIR = Path(__file__).resolve().parent


def migrations_directory() -> Path:
    """The Alembic scripts: the wheel's bundled copy, else the repository's ``migrations/``."""
    bundled = _PACKAGE_DIR / "_migrations"
    if (bundled / "env.py").is_file():
        return bundled
    source = _PACKAGE_DIR.parent / "migrations"
    if (source / "env.py").is_file():
        return source
    raise RuntimeError(
        f"relay_flow_projection's migrations are missing (looked in {bundled}, {source})"
    )


def alembic_config(target: Target | None = None) -> Config:
    """An Alembic ``Config`` for the packaged chain, independent of the working directory."""
    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    if target is not None:
        config.attributes[TARGET_ATTRIBUTE] = _url_text(resolve_target(target))
    return config


def _url_text(resolved: ResolvedTarget) -> str:
    return resolved.url.render_as_string(hide_password=False)


def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = script_directory().get_current_head()
    assert head is not None, "the migration chain has a single head"
    return head


def current_revision(connection: Connection) -> str | None:
    """The version row of the database (None when unversioned); leaves no transaction open."""
    try:
        heads = MigrationContext.configure(connection).get_current_heads()
    finally:
        connection.rollback()
    return heads[0] if heads else None


def run_upgrade(target: Target, revision: str = "head") -> None:
    try:
        command.upgrade(alembic_config(target), revision)
    except CommandError as exc:
        raise SchemaOutOfDate(
            f"cannot upgrade {resolve_target(target).describe()} to {revision}: {exc}"
        ) from exc


def run_downgrade(target: Target, revision: str) -> None:
    command.downgrade(alembic_config(target), revision)
