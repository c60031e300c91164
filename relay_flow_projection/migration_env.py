"""What ``migrations/env.py`` runs: one migration environment for the CLI and ``upgrade()``.

Kept in the package (not in env.py) so it is typed, linted and importable by
tests; env.py only calls :func:`run`.
"""

from __future__ import annotations

import logging
import logging.config
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import func, literal, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from .dialect import dialect_name
from .engine import DEFAULT_URL, build_engine, resolve_target
from .errors import ProjectionError, SchemaOutOfDate
from .legacy import detect_legacy_generation
from .schema import metadata

log = logging.getLogger("relay_flow_projection.migrations")

URL_ENVIRONMENT_VARIABLE = "RELAY_FLOW_DATABASE_URL"
# Set by relay_flow_projection.upgrade(); wins over the environment.
TARGET_ATTRIBUTE = "relay_target"


def migration_url(context: EnvironmentContext) -> str:
    """upgrade()'s target, else $RELAY_FLOW_DATABASE_URL, else ``-x url=``, else the default."""
    target = context.config.attributes.get(TARGET_ATTRIBUTE)
    if target is not None:
        return str(target)
    from_x = context.get_x_argument(as_dictionary=True).get("url")
    return os.environ.get(URL_ENVIRONMENT_VARIABLE) or from_x or DEFAULT_URL


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only relay tables: the projection may share a database with engine tables."""
    if type_ == "table":
        return name is not None and name.startswith("relay_")
    return True


def _configure(context: EnvironmentContext, **kwargs: Any) -> None:
    context.configure(
        target_metadata=metadata,
        include_name=include_name,
        compare_type=True,
        # SQLite alters tables by rebuilding them ("batch" mode); the rebuild
        # runs with foreign keys off (see run()), or dropping the old parent
        # table would cascade-delete every child row.
        render_as_batch=True,
        transaction_per_migration=True,
        **kwargs,
    )


@contextmanager
def _migration_lock(connection: Connection) -> Iterator[None]:
    """Serialize concurrent upgrades of one PostgreSQL database (and schema) or SQLite file.

    A session-level advisory lock: the second deployer waits, then finds the
    chain already applied. SQLite has no such lock, and processes initializing
    one new file at once ran the chain concurrently ("expected to match one row
    when updating ... in alembic_version"): they take an exclusive ``flock`` on
    a sidecar ``<database>.migrate-lock`` file (0600) instead.
    """
    if dialect_name(connection.dialect) != "postgresql":
        with _sqlite_file_lock(connection.engine.url.database):
            yield
        return
    key = func.hashtext(literal("relay_flow_projection:") + func.current_schema())
    connection.execute(select(func.pg_advisory_lock(key)))
    connection.commit()
    try:
        yield
    finally:
        connection.rollback()
        connection.execute(select(func.pg_advisory_unlock(key)))
        connection.commit()


@contextmanager
def _sqlite_file_lock(database: str | None) -> Iterator[None]:
    """Hold an exclusive lock on ``<database>.migrate-lock`` (in-memory databases: none)."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform: upgrades are not serialized
        yield
        return
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    path = f"{database}.migrate-lock"
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ProjectionError(f"cannot create the migration lock {path}: {exc}") from exc
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # released when the descriptor closes
        yield
    finally:
        os.close(descriptor)


def adopt_unversioned(connection: Connection, script: ScriptDirectory) -> None:
    """Stamp an unversioned Go-era database with its generation's revision, and commit.

    The stamp is committed on its own: an uncommitted stamp vanishes under
    SQLAlchemy 2.x and the next run finds "no such column" (Dagster #25686).
    """
    migration = MigrationContext.configure(connection)
    if migration.get_current_heads():
        connection.rollback()
        return
    revision = detect_legacy_generation(connection)
    if revision is None:
        connection.rollback()
        return
    log.warning("adopting an unversioned relay-flow database: stamping %s", revision)
    migration.stamp(script, revision)
    connection.commit()


def require_known_revision(connection: Connection, script: ScriptDirectory) -> None:
    """A database stamped by a newer release gets a clear error, not "Can't locate revision"."""
    heads = MigrationContext.configure(connection).get_current_heads()
    connection.rollback()
    error = newer_release_error(heads, script, "the database")
    if error is not None:
        raise error


def newer_release_error(
    revisions: Sequence[str], script: ScriptDirectory, subject: str
) -> SchemaOutOfDate | None:
    """The error for revisions this release does not know (None when it knows them all)."""
    known = {revision.revision for revision in script.walk_revisions()}
    unknown = [revision for revision in revisions if revision not in known]
    if not unknown:
        return None
    return SchemaOutOfDate(
        f"{subject} is at revision {', '.join(unknown)}, which this release of "
        f"relay_flow_projection does not know (its head is {script.get_current_head()}); "
        "it was written by a newer release: upgrade relay_flow_projection"
    )


def _changes_revision(context: EnvironmentContext) -> bool:
    """True for upgrade/downgrade/stamp; False for read-only commands such as ``check``."""
    try:
        return context.get_revision_argument() is not None
    except KeyError:  # commands that move no revision (check) set no destination
        return False


def _migrate(context: EnvironmentContext, connection: Connection) -> None:
    script = context.script
    with _migration_lock(connection):
        require_known_revision(connection, script)
        if _changes_revision(context):
            adopt_unversioned(connection, script)
        _configure(context, connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        if _changes_revision(context):
            connection.commit()
            _report_foreign_key_problems(connection)


def _run_online(context: EnvironmentContext) -> None:
    given = context.config.attributes.get("connection")
    # A caller-provided connection or engine (pytest-alembic, an application
    # that migrates on its own connection): its settings are the caller's.
    if isinstance(given, Engine):
        with given.connect() as connection:
            _migrate(context, connection)
        return
    if given is not None:
        _migrate(context, given)
        return
    resolved = resolve_target(migration_url(context))
    engine = build_engine(resolved, foreign_keys=False, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            _migrate(context, connection)
    finally:
        engine.dispose()


def _report_foreign_key_problems(connection: Connection) -> None:
    if dialect_name(connection.dialect) != "sqlite":
        return
    problems = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    connection.rollback()
    if problems:
        log.error("PRAGMA foreign_key_check reports %d rows after migrating", len(problems))


def _run_offline(context: EnvironmentContext) -> None:
    """``alembic upgrade head --sql``: print the DDL for DBAs who apply scripts by hand."""
    _configure(context, url=resolve_target(migration_url(context)).url, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run(context: EnvironmentContext) -> None:
    config = context.config
    if config.cmd_opts is not None and config.config_file_name is not None:
        # The alembic command line logs as alembic.ini says; a library caller
        # of upgrade() keeps its own logging configuration.
        logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)
    try:
        if context.is_offline_mode():
            _run_offline(context)
        else:
            _run_online(context)
    except ProjectionError as exc:
        if context.config.cmd_opts is not None:
            # The alembic command line prints CommandError as one line, no traceback.
            raise CommandError(str(exc)) from exc
        raise
