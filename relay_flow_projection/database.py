"""The opening helpers of API.md: upgrade, init, read-only inspection, open_projection,
and their asyncio counterpart open_async_projection.

Alembic (``migrate``, ``migration_env``) is imported only when a revision is run or
a database is not at head: opening one at head checks its version row with one
query (revisions.at_head), and start-up stays free of Alembic's import time.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from .driver_errors import translate_error
from .engine import (
    ResolvedTarget,
    Target,
    build_engine,
    check_sqlite_file,
    create_async_engine,
    is_mysql_url,
    require_asyncio_extension,
    resolve_target,
)
from .errors import ProjectionError, SchemaOutOfDate
from .identity import validate_identity
from .models import ExecutorIdentity
from .repository import RunProjection
from .revisions import HEAD_REVISION, at_head
from .statements import HAS_NONTERMINAL_RUNS

if TYPE_CHECKING:
    from .async_repository import AsyncRunProjection


def _check_file(resolved: ResolvedTarget) -> None:
    if resolved.path is not None:
        check_sqlite_file(resolved.path)


def upgrade(target: Target, revision: str = "head") -> None:
    """Run the Alembic chain on *target* (works from an installed wheel, in any directory)."""
    resolved = resolve_target(target)
    _check_file(resolved)
    subject = f"cannot upgrade {resolved.describe()} to {revision}"
    from . import migrate

    try:
        migrate.run_upgrade(target, revision)
    except ProjectionError:
        raise
    except Exception as exc:
        error = translate_error(exc, subject)
        if type(error) is ProjectionError:
            # Each revision is its own transaction: a failure keeps the last completed one.
            raise ProjectionError(
                f"{error}; the database stays at its last completed revision"
            ) from exc
        raise error from exc


_upgrade = upgrade  # open_projection's keyword argument shadows the name


def init_database(target: Target) -> None:
    """Create the database if needed and upgrade it to head."""
    upgrade(target)


def init_database_with_identity(target: Target, identity: ExecutorIdentity) -> None:
    """Validate *identity*, initialize, then write (or verify) the identity marker."""
    validate_identity(identity)
    init_database(target)
    with RunProjection._owning(build_engine(resolve_target(target))) as projection:
        projection.initialize_identity(identity)


def has_nonterminal_runs(target: Target) -> bool:
    """Read-only: never migrates and never creates a file."""
    resolved = resolve_target(target)
    engine = build_engine(resolved, read_only=True)
    try:
        with engine.connect() as connection:
            return bool(connection.execute(HAS_NONTERMINAL_RUNS).scalar_one())
    except Exception as exc:
        error = translate_error(exc, f"reading {resolved.describe()}")
        if isinstance(error, SchemaOutOfDate):
            raise ProjectionError(f"{resolved.describe()} holds no relay projection") from exc
        raise error from exc
    finally:
        engine.dispose()


def _refuse_missing_file(resolved: ResolvedTarget, upgrade: bool) -> None:
    _check_file(resolved)
    if not upgrade and resolved.path is not None and not resolved.path.exists():
        raise ProjectionError(
            f"{resolved.path} does not exist; create it with upgrade() "
            "or open_projection(..., upgrade=True)"
        )


def open_projection(
    target: Target, *, upgrade: bool = False, **engine_kwargs: Any
) -> RunProjection:
    """A RunProjection on a new engine it owns; SchemaOutOfDate unless the schema is at head.

    *engine_kwargs* go to create_engine (lock_timeout, connect_timeout, pool settings).
    """
    resolved = resolve_target(target)
    _refuse_missing_file(resolved, upgrade)
    if upgrade:
        _upgrade(target)
    engine = build_engine(resolved, **engine_kwargs)
    try:
        # A read: on SQLite it must not queue behind writers for the write lock.
        with engine.execution_options(relay_read_only=True).connect() as connection:
            require_head(connection, resolved)
    except BaseException as exc:
        engine.dispose()
        if isinstance(exc, Exception):
            raise translate_error(exc, f"opening {resolved.describe()}") from exc
        raise
    return RunProjection._owning(engine)


async def open_async_projection(
    target: Target, *, upgrade: bool = False, **engine_kwargs: Any
) -> AsyncRunProjection:
    """open_projection for asyncio: the Alembic chain runs in a worker thread (on the
    sync driver), so the event loop keeps running while a database is upgraded."""
    from .async_repository import AsyncRunProjection

    require_asyncio_extension()  # before any upgrade: one line naming the [async] extra
    resolved = resolve_target(target)
    _refuse_missing_file(resolved, upgrade)
    if upgrade:
        await asyncio.to_thread(_upgrade, _sync_driver_target(resolved))
    engine = create_async_engine(target, **engine_kwargs)
    try:
        async with engine.execution_options(relay_read_only=True).connect() as connection:
            await connection.run_sync(require_head, resolved)
    except BaseException as exc:
        await engine.dispose()
        if isinstance(exc, Exception):
            raise translate_error(exc, f"opening {resolved.describe()}") from exc
        raise
    return AsyncRunProjection._owning(engine)


def _sync_driver_target(resolved: ResolvedTarget) -> Target:
    """The target for the Alembic chain, which runs on the sync drivers (pysqlite, psycopg,
    PyMySQL)."""
    if resolved.path is not None:
        return resolved.path
    url = resolved.url
    if url.get_backend_name() == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    elif is_mysql_url(url):
        url = url.set(drivername=f"{url.get_backend_name()}+pymysql")
    elif url.get_backend_name() == "sqlite":
        url = url.set(drivername="sqlite")
    return url.render_as_string(hide_password=False)


def require_head(connection: Connection, resolved: ResolvedTarget) -> None:
    if at_head(connection):
        return  # one query, no Alembic: the everyday case
    from . import migrate
    from .migration_env import newer_release_error

    head = HEAD_REVISION
    current = migrate.current_revision(connection)
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
