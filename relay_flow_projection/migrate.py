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
from .migration_env import LOCK_TIMEOUT_ATTRIBUTE, TARGET_ATTRIBUTE, chain_revision

_PACKAGE_DIR = Path(__file__).resolve().parent


def migrations_directory() -> Path:
    """The Alembic scripts inside the installed package.

    A deployer's alembic.ini names the same directory as
    ``relay_flow_projection:migrations``, which Alembic resolves through
    importlib.resources, in a wheel and in an editable install alike.
    """
    scripts = _PACKAGE_DIR / "migrations"
    if not (scripts / "env.py").is_file():
        raise RuntimeError(f"relay_flow_projection's migrations are missing (looked in {scripts})")
    return scripts


def alembic_config(target: Target | None = None, *, lock_timeout: float | None = None) -> Config:
    """An Alembic ``Config`` for the packaged chain, independent of the working directory.

    *lock_timeout*: seconds to wait for another upgrader's migration lock
    (default $RELAY_FLOW_MIGRATION_LOCK_TIMEOUT, else 60).
    """
    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    if target is not None:
        config.attributes[TARGET_ATTRIBUTE] = _url_text(resolve_target(target))
    if lock_timeout is not None:
        config.attributes[LOCK_TIMEOUT_ATTRIBUTE] = lock_timeout
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
    """The projection's version row (None when unversioned); leaves no transaction open.

    The version table may also hold another chain's rows (README "Deploying"):
    those are not ours and are skipped.
    """
    try:
        heads = MigrationContext.configure(connection).get_current_heads()
    finally:
        connection.rollback()
    return chain_revision(heads, script_directory())


def run_upgrade(
    target: Target, revision: str = "head", *, lock_timeout: float | None = None
) -> None:
    try:
        command.upgrade(alembic_config(target, lock_timeout=lock_timeout), revision)
    except CommandError as exc:
        raise SchemaOutOfDate(
            f"cannot upgrade {resolve_target(target).describe()} to {revision}: {exc}"
        ) from exc


def run_downgrade(target: Target, revision: str, *, lock_timeout: float | None = None) -> None:
    try:
        command.downgrade(alembic_config(target, lock_timeout=lock_timeout), revision)
    except CommandError as exc:
        raise SchemaOutOfDate(
            f"cannot downgrade {resolve_target(target).describe()} to {revision}: {exc}"
        ) from exc
