"""What the chain's ``env.py`` runs: one migration environment for ``alembic`` and ``upgrade()``.

Kept in the package (not in env.py) so it is typed, linted and importable by
tests; env.py only calls :func:`run`.
"""

from __future__ import annotations

import logging
import logging.config
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import bindparam, func, literal, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import NullPool

from .dialect import dialect_name
from .driver_errors import translate_error
from .engine import (
    DEFAULT_URL,
    ResolvedTarget,
    build_engine,
    check_url,
    is_mysql_url,
    readable_target,
    resolve_target,
)
from .engine import url_error as url_error  # re-exported: cli/errors.py imports it from here
from .errors import DatabaseBusy, ProjectionError, SchemaOutOfDate
from .legacy import detect_legacy_generation
from .live_upgrade import (
    DDL_LOCK_TIMEOUT,
    printed_lock_timeouts,
    run_with_lock_retries,
    short_lock_waits,
    utc_text,
)
from .schema import metadata

log = logging.getLogger("relay_flow_projection.migrations")

URL_ENVIRONMENT_VARIABLE = "RELAY_FLOW_DATABASE_URL"
LOCK_TIMEOUT_ENVIRONMENT_VARIABLE = "RELAY_FLOW_MIGRATION_LOCK_TIMEOUT"
DEFAULT_MIGRATION_LOCK_TIMEOUT = 60.0
# Set by relay_flow_projection.upgrade(): the target, and the lock timeout (seconds).
TARGET_ATTRIBUTE = "relay_target"
LOCK_TIMEOUT_ATTRIBUTE = "relay_migration_lock_timeout"
# How often a waiting upgrader asks again for the lock.
_LOCK_POLL_SECONDS = 0.1


def migration_url(context: EnvironmentContext) -> str:
    """upgrade()'s target, else ``-x url=``, else $RELAY_FLOW_DATABASE_URL, else the default.

    What is typed on the command line wins over the environment, as Alembic
    users expect.
    """
    target = context.config.attributes.get(TARGET_ATTRIBUTE)
    if target is not None:
        return str(target)
    from_x = context.get_x_argument(as_dictionary=True).get("url")
    return from_x or os.environ.get(URL_ENVIRONMENT_VARIABLE) or DEFAULT_URL


def migration_lock_timeout(context: EnvironmentContext | None = None) -> float:
    """Seconds an upgrader waits for another one's migration lock.

    upgrade(..., lock_timeout=) / ``-x lock_timeout=``, else
    $RELAY_FLOW_MIGRATION_LOCK_TIMEOUT, else 60 s.
    """
    given: object = None
    source = "lock_timeout"
    if context is not None:
        given = context.config.attributes.get(LOCK_TIMEOUT_ATTRIBUTE)
        if given is None:
            given = context.get_x_argument(as_dictionary=True).get("lock_timeout")
    if given is None:
        given = os.environ.get(LOCK_TIMEOUT_ENVIRONMENT_VARIABLE) or None
        source = LOCK_TIMEOUT_ENVIRONMENT_VARIABLE
    if given is None:
        return DEFAULT_MIGRATION_LOCK_TIMEOUT
    try:
        seconds = float(given)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        raise ProjectionError(f"{source} must be a positive number of seconds, got {given!r}")
    return seconds


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Compare only relay tables: the projection may share a database with other tables."""
    if type_ == "table":
        return name is not None and name.startswith("relay_")
    return True


def _configure(context: EnvironmentContext, **kwargs: Any) -> None:
    context.configure(
        target_metadata=metadata,
        include_name=include_name,
        compare_type=True,
        # SQLite alters tables by rebuilding them ("batch" mode); the rebuild
        # runs with foreign keys off (see _run_online), or dropping the old
        # parent table would cascade-delete every child row.
        render_as_batch=True,
        transaction_per_migration=True,
        **kwargs,
    )


def _changes_revision(context: EnvironmentContext) -> bool:
    """True for upgrade/downgrade/stamp (which name a destination, ``base`` included);
    False for reading commands (current, check, history -i, revision --autogenerate)."""
    try:
        context.get_revision_argument()  # None for "base", which is a destination too
    except KeyError:  # the reading commands set no destination at all
        return False
    return True


# ---------------------------------------------------------------- locking ---


@contextmanager
def migration_lock(engine: Engine, timeout: float, subject: str) -> Iterator[None]:
    """Serialize upgrades of one PostgreSQL database (and schema) or SQLite file.

    PostgreSQL: a *transaction-scoped* advisory lock held by a transaction of
    its own, on a connection of its own, for the whole chain. Ending that
    transaction (or losing its connection) releases the lock, so it cannot
    outlive the upgrade -- unlike a session lock, which behind a
    transaction-pooling PgBouncer stayed on whichever server connection took
    it. The waiter polls ``pg_try_advisory_xact_lock`` and gives up after
    *timeout* seconds with a DatabaseBusy naming the holder.

    MySQL/MariaDB: a named lock (``GET_LOCK``) on a connection of its own,
    held for the whole chain (see :class:`_MySQLLock`).

    SQLite: an exclusive ``flock`` on ``<database>.migrate-lock`` (0600),
    removed again by its holder (see :func:`_sqlite_file_lock`).
    """
    family = dialect_name(engine.dialect)
    if family == "postgresql":
        with _PostgresLock(engine, timeout, subject).hold():
            yield
        return
    if family == "mysql":
        with _MySQLLock(engine, timeout, subject).hold():
            yield
        return
    with _sqlite_file_lock(engine.url.database, timeout, subject):
        yield


class _ServerLock:
    """What the server-side migration locks share: where, how long, and the message
    of a waiter that gave up."""

    def __init__(self, engine: Engine, timeout: float, subject: str) -> None:
        self.engine = engine
        self.timeout = timeout
        self.subject = subject

    def _gave_up(self, holder: str | None) -> str:
        who = holder or "another upgrade (which has just finished)"
        return (
            f"{self.subject}: the migration lock is held by {who}; gave up after "
            f"{self.timeout:g} s (set {LOCK_TIMEOUT_ENVIRONMENT_VARIABLE} to wait longer)"
        )


class _PostgresLock(_ServerLock):
    """The PostgreSQL migration lock of :func:`migration_lock`."""

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self.engine.connect() as connection:
            key = connection.execute(
                select(func.hashtext(literal(_POSTGRES_LOCK_PREFIX) + func.current_schema()))
            ).scalar_one()
            deadline = time.monotonic() + self.timeout
            while not connection.execute(_POSTGRES_TRY_LOCK).scalar_one():
                # End the failed attempt's transaction before waiting: behind a
                # transaction pooler an open transaction pins a server
                # connection, and waiters pinning the whole pool would starve
                # the holder's own migration transactions until they gave up.
                connection.rollback()
                if time.monotonic() >= deadline:
                    raise DatabaseBusy(self._busy_message(connection, key))
                time.sleep(_LOCK_POLL_SECONDS)
            try:
                yield
            finally:
                # Ends the lock's transaction: the lock goes with it.
                connection.rollback()

    def _busy_message(self, connection: Connection, key: int) -> str:
        holder = connection.execute(
            _LOCK_HOLDER, {"classid": (key >> 32) & 0xFFFFFFFF, "objid": key & 0xFFFFFFFF}
        ).first()
        if holder is None:
            return self._gave_up(None)
        pid, since, application, address = holder
        where = f" from {address}" if address else ""
        name = f" ({application})" if application else ""
        return self._gave_up(
            f"another upgrade, PostgreSQL backend pid {pid}{name}{where}, "
            f"holding it since {utc_text(since)}"
        )


class _MySQLLock(_ServerLock):
    """The MySQL/MariaDB migration lock of :func:`migration_lock`.

    A named lock belongs to the session that took it: it is released when
    that connection ends, however the upgrade ends (a kill, a lost network),
    and the server waits for it itself, up to *timeout*. The name is per
    database (64 characters at most): the chain's tables live in one.
    """

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self.engine.connect() as connection:
            name = connection.execute(MYSQL_LOCK_NAME).scalar_one()
            got = connection.execute(
                select(func.get_lock(bindparam("name"), bindparam("wait"))),
                {"name": name, "wait": self.timeout},
            ).scalar_one()
            connection.rollback()  # no transaction stays open while the chain runs
            if got != 1:
                raise DatabaseBusy(self._busy_message(connection, name))
            try:
                yield
            finally:
                try:
                    release = select(func.release_lock(bindparam("name")))
                    connection.execute(release, {"name": name})
                    connection.rollback()
                except DBAPIError as exc:
                    if not exc.connection_invalidated:
                        raise
                    # The connection is gone, and its lock went with it.

    def _busy_message(self, connection: Connection, name: str) -> str:
        holder = connection.execute(_MYSQL_LOCK_HOLDER, {"name": name}).first()
        if holder is None:
            return self._gave_up(None)
        session, host, seconds = holder
        return self._gave_up(
            f"another upgrade, MySQL connection {session} from {host}, for {seconds} s"
        )


_POSTGRES_LOCK_PREFIX = "relay_flow_projection:"
# Without bound parameters, on purpose: psycopg runs a statement with them as a
# portal that keeps its snapshot until the next statement, and this transaction
# then idles for the whole chain -- while a concurrent index build (0005) waits
# for every transaction holding an older snapshot, this one too: forever.
_POSTGRES_TRY_LOCK = text(
    f"SELECT pg_try_advisory_xact_lock(hashtext('{_POSTGRES_LOCK_PREFIX}' || current_schema()))"
)
MYSQL_LOCK_NAME = select(
    func.concat("relay_flow_projection:", func.left(func.sha2(func.database(), 256), 40))
)
# The holder's session, and since when it has been in its current state.
_MYSQL_LOCK_HOLDER = text(
    "SELECT id, host, time FROM information_schema.processlist WHERE id = IS_USED_LOCK(:name)"
)


# One bigint advisory key shows in pg_locks as classid = high 32 bits,
# objid = low 32 bits, objsubid = 1. xact_start is when the holder's lock
# transaction began, i.e. since when it holds the lock.
_LOCK_HOLDER = text(
    "SELECT a.pid, a.xact_start, a.application_name, a.client_addr::text "
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.classid::bigint = :classid AND l.objid::bigint = :objid "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "LIMIT 1"
)


@contextmanager
def _sqlite_file_lock(database: str | None, timeout: float, subject: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<database>.migrate-lock`` (in-memory databases: none).

    Processes initializing one new file at once ran the chain concurrently
    ("expected to match one row when updating ... in alembic_version"), hence
    the lock. Its holder unlinks the file before releasing it, and a process
    that obtains the lock on a file that is no longer the one at the path
    (unlinked meanwhile) starts over: two processes can never hold "the" lock
    at once, and no lock file stays behind.
    """
    try:
        import fcntl
    except ImportError:  # no flock on this platform: upgrades are not serialized
        yield
        return
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    path = f"{database}.migrate-lock"
    deadline = time.monotonic() + timeout
    while True:
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ProjectionError(
                f"{subject}: cannot create the migration lock {path}: {exc.strerror or exc}"
            ) from exc
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DatabaseBusy(
                            f"{subject}: the migration lock {path} is held by another upgrade; "
                            f"gave up after {timeout:g} s "
                            f"(set {LOCK_TIMEOUT_ENVIRONMENT_VARIABLE} to wait longer)"
                        ) from None
                    time.sleep(_LOCK_POLL_SECONDS)
            if _is_current_file(descriptor, path):
                break
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)  # the previous holder removed it: lock the new file
    try:
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(descriptor)  # releases the flock


def _is_current_file(descriptor: int, path: str) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


# ------------------------------------------------------------ the chain ---


def adopt_unversioned(
    migration: MigrationContext, connection: Connection, script: ScriptDirectory
) -> None:
    """Stamp an unversioned Go-era database with its generation's revision, and commit.

    The stamp is committed on its own: an uncommitted stamp vanishes under
    SQLAlchemy 2.x and the next run finds "no such column" (Dagster #25686).
    """
    if migration.get_current_heads() or dialect_name(connection.dialect) == "mysql":
        # MySQL: no Go release wrote one, and relay tables without a version
        # row are what a killed first revision left (MySQL commits each DDL
        # statement): the chain runs again from 0001, whose steps skip what
        # is done.
        connection.rollback()
        return
    revision = detect_legacy_generation(connection)
    if revision is None:
        connection.rollback()
        return
    log.warning("adopting an unversioned relay-flow database: stamping %s", revision)
    migration.stamp(script, revision)
    connection.commit()


def require_known_revision(
    migration: MigrationContext, connection: Connection, script: ScriptDirectory, changes: bool
) -> None:
    """Refuse what this environment cannot run the chain on.

    A database stamped by a newer release gets a clear error, not "Can't locate
    revision". A version table shared with another chain (an application that
    runs ours from its own environment, README "An application with its own
    Alembic environment") is judged by our branch's row only: see_our_branch_only.
    """
    heads = migration.get_current_heads()
    connection.rollback()
    error = newer_release_error(heads, script, "the database")
    if error is not None:
        raise error
    foreign = foreign_revisions(heads, script)
    if foreign:
        if changes and migration.purge:
            raise ProjectionError(
                "stamp --purge would delete the rows of another chain sharing alembic_version "
                f"({', '.join(foreign)}); stamp without --purge"
            )
        log.info(
            "alembic_version also holds another chain's revisions (%s): "
            "judging relay_flow_projection's branch only",
            ", ".join(foreign),
        )
        see_our_branch_only(migration, script)


def our_heads(heads: Sequence[str], script: ScriptDirectory) -> tuple[str, ...]:
    """The heads of *heads* that are revisions of our chain (all of them when none is:
    a newer release's, which newer_release_error reports)."""
    foreign = set(foreign_revisions(heads, script))
    return tuple(head for head in heads if head not in foreign) or tuple(heads)


def see_our_branch_only(migration: MigrationContext, script: ScriptDirectory) -> None:
    """Make *migration* read only our chain's rows of a shared version table.

    Alembic's commands (current, check, upgrade, downgrade, stamp) all start
    from MigrationContext.get_current_heads; with another chain's rows hidden,
    they judge and move our branch alone. Alembic updates and deletes version
    rows one by one, by value: the other chain's rows are left as they are.
    """
    read_every_head = migration.get_current_heads

    def heads_of_our_branch() -> tuple[str, ...]:
        return our_heads(read_every_head(), script)

    migration.get_current_heads = heads_of_our_branch  # type: ignore[method-assign]


def foreign_revisions(heads: Sequence[str], script: ScriptDirectory) -> list[str]:
    """The heads that belong to no revision of this chain."""
    known = {revision.revision for revision in script.walk_revisions()}
    return [head for head in heads if head not in known]


def chain_revision(heads: Sequence[str], script: ScriptDirectory) -> str | None:
    """The projection's own revision among the version table's *heads*.

    Ours is the head this release knows; with none known, the first one (a
    newer release's, which newer_release_error reports).
    """
    foreign = set(foreign_revisions(heads, script))
    ours = [head for head in heads if head not in foreign] or list(heads)
    return ours[0] if ours else None


def newer_release_error(
    revisions: Sequence[str], script: ScriptDirectory, subject: str
) -> SchemaOutOfDate | None:
    """The error for revisions this release does not know (None when it knows them all,
    or knows one of them: the others then belong to another chain sharing the table)."""
    unknown = foreign_revisions(revisions, script)
    if not unknown or len(unknown) < len(revisions):
        return None
    shared = (
        " (or, if another Alembic chain shares this alembic_version table, ours has not run)"
        if len(unknown) > 1
        else ""
    )
    return SchemaOutOfDate(
        f"{subject} is at revision {', '.join(unknown)}, which this release of "
        f"relay_flow_projection does not know (its head is {script.get_current_head()}); "
        "it was written by a newer release: upgrade the relay-flow-projection package "
        f"(pip install -U relay-flow-projection), not the database{shared}"
    )


def _migrate(context: EnvironmentContext, connection: Connection, subject: str) -> None:
    """Configure once (Alembic logs "Context impl ..." once per configure), check, run."""
    script = context.script
    _configure(context, connection=connection)
    migration = context.get_context()
    changes = _changes_revision(context)
    require_known_revision(migration, connection, script, changes)
    if not changes:
        _run_migrations(context)
        return
    adopt_unversioned(migration, connection, script)
    with short_lock_waits(connection):
        run_with_lock_retries(
            lambda: _run_migrations(context),
            connection,
            migration_lock_timeout(context),
            subject,
        )
    connection.commit()
    _report_foreign_key_problems(connection)


def _run_migrations(context: EnvironmentContext) -> None:
    with context.begin_transaction():
        context.run_migrations()


def _migrate_with_lock(
    context: EnvironmentContext, engine: Engine, connection: Connection, subject: str
) -> None:
    if not _changes_revision(context):
        _migrate(context, connection, subject)  # reading commands take no lock, write nothing
        return
    with migration_lock(engine, migration_lock_timeout(context), subject):
        _migrate(context, connection, subject)


def _subject(resolved: ResolvedTarget | None, context: EnvironmentContext) -> str:
    where = "the database" if resolved is None else resolved.describe()
    if not _changes_revision(context):
        return f"reading {where}"
    return f"migrating {where}"


def _run_online(context: EnvironmentContext) -> None:
    given = context.config.attributes.get("connection")
    # A caller-provided connection or engine (pytest-alembic, an application
    # that migrates on its own connection): its settings are the caller's.
    if isinstance(given, Engine):
        with given.connect() as connection:
            _migrate_with_lock(context, given, connection, _subject(None, context))
        return
    if isinstance(given, Connection):
        _migrate_with_lock(context, given.engine, given, _subject(None, context))
        return
    resolved = check_url(resolve_target(migration_url(context)))
    reading = not _changes_revision(context)
    if reading and resolved.path is not None and not resolved.path.exists():
        # Reading commands never create a database (or a lock file).
        raise ProjectionError(
            f"{resolved.path} does not exist; create it with `alembic upgrade head`"
        )
    subject = _subject(resolved, context)
    if reading:
        resolved = readable_target(resolved)
    else:
        _require_writable(resolved, subject)
    # Through build_engine: a missing driver names the extra to install, and a
    # SQLite file that is not a database is refused before SQLite touches it.
    try:
        engine = build_engine(
            resolved,
            foreign_keys=False,
            read_only=reading,
            # MySQL/MariaDB: the sessions' lock waits are the revisions' short
            # ones (live_upgrade.short_lock_waits); SQLite keeps its default.
            **({"lock_timeout": DDL_LOCK_TIMEOUT} if is_mysql_url(resolved.url) else {}),
            long_statements=True,
            poolclass=NullPool,
        )
    except ArgumentError as exc:
        raise url_error(exc) from exc
    try:
        with engine.connect() as connection:
            _migrate_with_lock(context, engine, connection, subject)
    except Exception as exc:
        if context.config.cmd_opts is None:
            raise  # upgrade() translates, naming the revision it was going to
        # The alembic command line: one translated line, never a driver traceback.
        error = translate_error(exc, subject)
        if error is exc:
            raise
        raise error from exc
    finally:
        engine.dispose()


def _require_writable(resolved: ResolvedTarget, subject: str) -> None:
    """Say "read-only" plainly, before SQLite fails halfway with "cannot create"."""
    path = resolved.path
    if path is None or not path.exists():
        return
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        raise ProjectionError(
            f"{subject}: the database is read-only ({path} or its directory cannot be "
            "written, and SQLite writes its -wal and -shm files beside it)"
        )


def _report_foreign_key_problems(connection: Connection) -> None:
    if dialect_name(connection.dialect) != "sqlite":
        return
    problems = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    connection.rollback()
    if problems:
        log.error("PRAGMA foreign_key_check reports %d rows after migrating", len(problems))


def _run_offline(context: EnvironmentContext) -> None:
    """``alembic upgrade head --sql``: print the DDL for DBAs who apply scripts by hand."""
    url = resolve_target(migration_url(context)).url
    _configure(context, url=url, literal_binds=True)
    with context.begin_transaction():
        # First, for the whole script: locks are waited for briefly (live_upgrade).
        for statement in printed_lock_timeouts(dialect_name(url.get_backend_name())):
            context.execute(statement)
        context.run_migrations()


def run(context: EnvironmentContext) -> None:
    config = context.config
    command_line = config.cmd_opts is not None
    if command_line and config.config_file_name is not None:
        # The alembic command line logs as alembic.ini says (a two-line ini
        # has no logging sections: Alembic's defaults apply); a library
        # caller of upgrade() keeps its own logging configuration.
        _configure_logging(config.config_file_name)
    try:
        if context.is_offline_mode():
            _run_offline(context)
        else:
            _run_online(context)
    except ProjectionError as exc:
        if command_line:
            # The alembic command line prints CommandError as one line, no traceback.
            raise CommandError(str(exc)) from exc
        raise


def _configure_logging(config_file: str) -> None:
    import configparser

    parser = configparser.ConfigParser()
    parser.read(config_file)
    if parser.has_section("loggers"):
        logging.config.fileConfig(config_file, disable_existing_loggers=False)
