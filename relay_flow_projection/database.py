"""The opening helpers of API.md: upgrade, init, read-only inspection, open_projection."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from . import migrate
from .engine import ResolvedTarget, Target, build_engine, check_sqlite_file, resolve_target
from .errors import NotAProjectionDatabase, ProjectionError, SchemaOutOfDate
from .identity import validate_identity
from .migration_env import newer_release_error
from .models import ExecutorIdentity
from .repository import RunProjection
from .statements import HAS_NONTERMINAL_RUNS


def _check_file(resolved: ResolvedTarget) -> None:
    if resolved.path is not None:
        check_sqlite_file(resolved.path)


def _translate_open_error(exc: DBAPIError, resolved: ResolvedTarget) -> ProjectionError:
    text = str(exc.orig)
    if "file is not a database" in text or "malformed" in text:
        return NotAProjectionDatabase(
            f"{resolved.describe()} is not a usable SQLite database: {text}"
        )
    return ProjectionError(f"cannot open {resolved.describe()}: {text}")


def upgrade(target: Target, revision: str = "head") -> None:
    """Run the Alembic chain on *target* (works from an installed wheel, in any directory)."""
    resolved = resolve_target(target)
    _check_file(resolved)
    try:
        migrate.run_upgrade(target, revision)
    except DBAPIError as exc:
        error = _translate_open_error(exc, resolved)
        if isinstance(error, NotAProjectionDatabase):
            raise error from exc
        # Each revision is its own transaction: a failure keeps the last completed one.
        raise ProjectionError(
            f"cannot upgrade {resolved.describe()} to {revision}: {exc.orig}; "
            "the database stays at its last completed revision"
        ) from exc


_upgrade = upgrade  # open_projection's keyword argument shadows the name


def init_database(target: Target) -> None:
    """Create the database if needed and upgrade it to head."""
    upgrade(target)


def init_database_with_identity(target: Target, identity: ExecutorIdentity) -> None:
    """Validate *identity*, initialize, then write (or verify) the identity marker."""
    validate_identity(identity)
    init_database(target)
    engine = build_engine(resolve_target(target))
    try:
        RunProjection(engine).initialize_identity(identity)
    finally:
        engine.dispose()


def has_nonterminal_runs(target: Target) -> bool:
    """Read-only: never migrates and never creates a file."""
    resolved = resolve_target(target)
    engine = build_engine(resolved, read_only=True)
    try:
        with engine.connect() as connection:
            return bool(connection.execute(HAS_NONTERMINAL_RUNS).scalar_one())
    except DBAPIError as exc:
        text = str(exc.orig)
        if "no such table" in text or getattr(exc.orig, "sqlstate", None) == "42P01":
            raise ProjectionError(f"{resolved.describe()} holds no relay projection") from exc
        raise _translate_open_error(exc, resolved) from exc
    finally:
        engine.dispose()


def open_projection(
    target: Target, *, upgrade: bool = False, **engine_kwargs: Any
) -> RunProjection:
    """A RunProjection on a new engine; SchemaOutOfDate unless the schema is at head."""
    resolved = resolve_target(target)
    _check_file(resolved)
    if not upgrade and resolved.path is not None and not resolved.path.exists():
        raise SchemaOutOfDate(
            f"{resolved.path} does not exist; create it with upgrade() "
            "or open_projection(..., upgrade=True)"
        )
    if upgrade:
        _upgrade(target)
    engine = build_engine(resolved, **engine_kwargs)
    try:
        require_head(engine, resolved)
    except BaseException:
        engine.dispose()
        raise
    return RunProjection(engine)


def require_head(engine: Engine, resolved: ResolvedTarget) -> None:
    head = migrate.head_revision()
    try:
        # A read: on SQLite it must not queue behind writers for the write lock.
        with engine.execution_options(relay_read_only=True).connect() as connection:
            current = migrate.current_revision(connection)
    except DBAPIError as exc:
        raise _translate_open_error(exc, resolved) from exc
    if current != head:
        # A newer release's revision: upgrading cannot help, the advice below would be wrong.
        newer = newer_release_error(
            [current] if current else [], migrate.script_directory(), resolved.describe()
        )
        if newer is not None:
            raise newer
        raise SchemaOutOfDate(
            f"{resolved.describe()} is at revision {current or '(none)'}, not at head {head}; "
            "run `alembic upgrade head` or open_projection(..., upgrade=True)"
        )
