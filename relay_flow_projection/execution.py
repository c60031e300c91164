"""How every operation runs: its transaction, one retry after a dropped connection,
the SQLite writer queue, lock timeouts, and the one translation of driver errors.

An operation (``operations.Operation``) is a function of a SQLAlchemy
``Connection`` plus what it is about. ``run_in_transaction`` is the part both
facades share: it opens the transaction an operation needs and runs its body.
``SyncExecutor`` and ``AsyncExecutor`` differ only in how they wait -- for the
SQLite writer queue and for a connection -- and the async one reaches the same
``run_in_transaction`` through ``AsyncConnection.run_sync``.

Everything here uses documented SQLAlchemy APIs only: ``Engine.connect``,
``Engine.execution_options``, ``Connection.begin``, ``Connection.execute`` /
``exec_driver_sql``, ``Connection.connection`` (the pooled DBAPI connection, for
one ``PRAGMA`` before ``BEGIN``), ``DBAPIError.orig`` and
``DBAPIError.connection_invalidated``, ``Pool`` identity,
``AsyncEngine.connect`` / ``AsyncConnection.start`` / ``run_sync`` / ``close``,
``AsyncEngine.sync_engine``.

Transactions
------------
* Reads are one statement (or a few that need no isolation from each other)
  and run outside a transaction: in autocommit on PostgreSQL, and without
  ``BEGIN`` on SQLite, so they never queue behind writers.
* Writes run in one transaction. On SQLite it begins with ``BEGIN IMMEDIATE``
  (engine.py's ``begin`` listener) behind one in-process lock per connection
  pool: a fair queue instead of threads spinning inside ``busy_timeout``. On
  PostgreSQL the transaction starts with ``SET LOCAL lock_timeout``: a
  transaction-scoped setting is the only kind a transaction-pooling
  PgBouncer carries to the server connection that runs the statements. On
  MySQL/MariaDB the session's ``innodb_lock_wait_timeout`` (set on connect,
  whole seconds) bounds lock waits; READ COMMITTED keeps gap locks out.
* ``lock_timeout`` is one budget per call: on SQLite, what the in-process queue
  used is taken off the busy timeout of that transaction.
* A write that deletes every row referring to what it deletes itself (the
  retention sweep: ``Operation.deletes_dependents``) runs on SQLite with
  ``foreign_keys`` off for its transaction, restored after it.

Retries
-------
Every write is an idempotent durable activity, so a call whose connection
turns out dead (the server restarted, failed over, or a pooler dropped it) is
run once more on a fresh connection, and one whose transaction the server
rolled back to break a deadlock (PostgreSQL 40P01, MySQL 1213) up to
``DEADLOCK_ATTEMPTS`` times in all, after a short random pause
(``_retry_delay``). SQLAlchemy has already invalidated the
whole pool when it saw the disconnect, so the retry gets a new connection and
no later call receives one broken by the same outage -- without a ping on
every checkout. A failure to connect is never retried here: waiting twice for
``connect_timeout`` would only double the caller's wait.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import sqlite3
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import Pool

from .dialect import dialect_name, read_only_view
from .errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    NotAProjectionDatabase,
    ProjectionError,
    RunNotFound,
    SchemaOutOfDate,
)
from .url_secrets import scrub

if TYPE_CHECKING:  # the asyncio extension loads only for the async facade
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

# The execution option create_engine() stores lock_timeout under; an engine
# made elsewhere gets the API's default.
LOCK_TIMEOUT_OPTION = "relay_lock_timeout"
DEFAULT_LOCK_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Operation(Generic[T]):
    """One call of the API: its body and what error messages should name.

    *subject* names the run, node or visit ("update_node of run 'r1' ...").
    *missing_run*: a foreign-key violation in this write means that run does
    not exist. *writes*: the body needs a write transaction.
    *deletes_dependents*: the body deletes every row that refers to what it
    deletes, itself, so SQLite's per-row foreign-key checks would find nothing:
    its transaction runs with ``foreign_keys`` off (see _sqlite_foreign_keys_off).
    """

    subject: str
    body: Callable[[Connection], T]
    writes: bool
    missing_run: str | None = None
    deletes_dependents: bool = False


def busy_timeout_pragma(seconds: float) -> str:
    """SQLite's lock wait for *seconds* (at least 1 ms: 0 would mean "fail at once")."""
    return f"PRAGMA busy_timeout = {int(max(1, round(seconds * 1000)))}"


def lock_timeout_of(engine: Engine) -> float:
    value = engine.get_execution_options().get(LOCK_TIMEOUT_OPTION, DEFAULT_LOCK_TIMEOUT)
    return float(value)


# --------------------------------------------------------------- errors ---

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 5, 6, 8
_SQLITE_CONSTRAINT_FOREIGNKEY = 787

_SQLSTATE_FOREIGN_KEY = "23503"
_SQLSTATES_MISSING_SCHEMA = ("42P01", "42703")  # undefined table / column
# lock_not_available (lock_timeout), query_canceled (statement_timeout),
# serialization failure, deadlock: someone else held what this call needed.
_SQLSTATES_BUSY = ("55P03", "57014", "40001", "40P01")
# admin/crash shutdown, cannot connect now, too many connections, a standby
# that refuses writes after a failover.
_SQLSTATES_UNAVAILABLE = ("57P01", "57P02", "57P03", "53300", "25006")


# MySQL/MariaDB error numbers (the first argument of PyMySQL's and aiomysql's errors).
_MYSQL_DEADLOCK = 1213
_MYSQL_LOCK_WAIT_TIMEOUT = 1205  # row locks and metadata locks alike
_MYSQL_BUSY = (_MYSQL_LOCK_WAIT_TIMEOUT, _MYSQL_DEADLOCK)
_MYSQL_MISSING_SCHEMA = (1146, 1054)  # no such table / column
_MYSQL_FOREIGN_KEY = 1452
# Data too long, incorrect string / datetime / integer value, out of range,
# truncated, NULL into NOT NULL: the value, not the database, is wrong.
_MYSQL_BAD_VALUE = (1406, 1366, 1292, 1264, 1265, 1367, 1048)
# Cannot connect (socket, TCP, host), server gone / connection lost, killed,
# shutting down, too many connections, a read-only server (a demoted primary).
_MYSQL_UNAVAILABLE = (2002, 2003, 2005, 2006, 2013, 2014, 2055, 1927, 4031, 1053, 1040, 1290)
# Access denied (user, password, database grant, auth plugin), unknown database:
# calling again cannot help.
_MYSQL_REFUSED_LOGIN = (1044, 1045, 1698)
_MYSQL_UNKNOWN_DATABASE = 1049
DEADLOCK_ATTEMPTS = 4


def _sqlite_code(orig: BaseException) -> int | None:
    code = getattr(orig, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def translate_error(
    exc: BaseException,
    subject: str,
    *,
    missing_run: str | None = None,
    lock_timeout: float | None = None,
) -> BaseException:
    """The API.md error for a driver or SQLAlchemy exception raised during *subject*.

    The one place that maps driver errors, by SQLite result code, PostgreSQL
    SQLSTATE and MySQL error number wherever the driver gives one; a value the
    database refuses (MySQL's strict mode) is a ``ValueError``. Errors of this package
    pass through unchanged; anything unrecognised becomes a ``ProjectionError``
    naming *subject*. No message carries a password (url_secrets.scrub).
    """
    error = _translate(exc, subject, missing_run, lock_timeout)
    return error if error is exc else _without_secrets(error)


def _without_secrets(error: BaseException) -> BaseException:
    """*error* (made here) with every password this process was given masked: a
    driver's text may echo a connection string."""
    message = str(error)
    clean = scrub(message)
    return error if clean == message else type(error)(clean)


def _translate(
    exc: BaseException, subject: str, missing_run: str | None, lock_timeout: float | None
) -> BaseException:
    if isinstance(exc, ProjectionError):
        return exc
    waited = "" if lock_timeout is None else f" within lock_timeout ({lock_timeout:g} s)"
    if isinstance(exc, PoolTimeout):
        return DatabaseBusy(f"{subject}: no pooled connection became free{waited}: {exc}")
    if _unwrapped_driver_error(exc):
        return _translate_driver_error(exc, exc, subject, missing_run, waited)
    if not isinstance(exc, DBAPIError):
        if isinstance(exc, TimeoutError | OSError):  # asyncpg's connect raises these bare
            return DatabaseUnavailable(f"{subject}: the database cannot be reached: {exc!r}")
        if isinstance(exc, SQLAlchemyError):
            return ProjectionError(f"{subject}: {exc}")
        return exc
    return _translate_driver_error(exc, exc.orig, subject, missing_run, waited)


def _unwrapped_driver_error(exc: BaseException) -> bool:
    """A driver error SQLAlchemy did not wrap in ``DBAPIError``.

    Raised by a DBAPI cursor used directly (PRAGMA), or by a driver call in a
    ``before_cursor_execute`` listener: SQLAlchemy 2.0 runs those listeners
    outside the block that wraps driver errors (2.1 inside).
    """
    if isinstance(exc, sqlite3.Error):
        return True
    return _psycopg_error(exc, "Error") or _mysql_code(exc) is not None


def _mysql_code(value: object) -> int | None:
    """The MySQL error number of one of PyMySQL's exceptions (aiomysql raises them
    too); looked up only if something already imported PyMySQL."""
    pymysql = sys.modules.get("pymysql")
    if pymysql is None or not isinstance(value, pymysql.err.MySQLError):
        return None
    code = value.args[0] if value.args else None
    return code if isinstance(code, int) else None


def is_deadlock(orig: object) -> bool:
    """The server broke a deadlock by rolling this transaction back (all of it)."""
    return getattr(orig, "sqlstate", None) == "40P01" or _mysql_code(orig) == _MYSQL_DEADLOCK


def is_lock_wait(orig: object) -> bool:
    """The statement gave up waiting for a lock (lock_timeout, MySQL's lock wait
    timeouts), or lost a deadlock: nothing of its transaction committed."""
    return (
        is_deadlock(orig)
        or getattr(orig, "sqlstate", None) == "55P03"
        or _mysql_code(orig) == _MYSQL_LOCK_WAIT_TIMEOUT
    )


def _psycopg_error(value: object, *classes: str) -> bool:
    """*value* is one of psycopg's exception *classes*. psycopg is an optional
    extra, so it is looked up only if something already imported it."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(
        value, tuple(getattr(psycopg, name) for name in classes)
    )


def _translate_driver_error(
    exc: BaseException, orig: Any, subject: str, missing_run: str | None, waited: str
) -> BaseException:
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    code = _sqlite_code(orig)
    if code is not None or isinstance(orig, sqlite3.Error):
        primary = None if code is None else code & 0xFF
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return DatabaseBusy(
                f"{subject}: the SQLite database stayed locked by another connection{waited}"
            )
        if code == _SQLITE_CONSTRAINT_FOREIGNKEY and missing_run is not None:
            return RunNotFound(f"run {missing_run!r} not found")
        if primary in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
            return NotAProjectionDatabase(f"{subject}: not a usable SQLite database: {text}")
        if primary == _SQLITE_READONLY:
            return ProjectionError(f"{subject}: the database is read-only ({text})")
        if "no such table" in text or "no such column" in text:  # SQLITE_ERROR has no subcode
            return _schema_out_of_date(subject)
        return ProjectionError(f"{subject}: {text}")
    mysql_code = _mysql_code(orig)
    if mysql_code is not None:
        return _translate_mysql_error(exc, mysql_code, orig, subject, missing_run, waited)
    sqlstate = getattr(orig, "sqlstate", None)
    refused = refused_login(orig, sqlstate, text)
    if refused is not None:
        return ProjectionError(f"{subject}: {refused}")
    if sqlstate == _SQLSTATE_FOREIGN_KEY and missing_run is not None:
        return RunNotFound(f"run {missing_run!r} not found")
    if sqlstate in _SQLSTATES_MISSING_SCHEMA:
        return _schema_out_of_date(subject)
    if sqlstate in _SQLSTATES_BUSY:
        return DatabaseBusy(f"{subject}: a lock held by another session was not released{waited}")
    if (
        (isinstance(exc, DBAPIError) and exc.connection_invalidated)
        or sqlstate in _SQLSTATES_UNAVAILABLE
        or (isinstance(sqlstate, str) and sqlstate.startswith("08"))
        # psycopg reports refused, timed-out and closed connections without a SQLSTATE
        or (sqlstate is None and _connection_failure(exc, orig))
    ):
        return DatabaseUnavailable(f"{subject}: the database is unavailable: {text}")
    return ProjectionError(f"{subject}: {text}")


# PostgreSQL's answers to a login that can never succeed: calling again cannot help.
_SQLSTATE_LOGIN_REFUSED = {
    "3D000": "the database does not exist",  # invalid_catalog_name
    "28000": "the server refused the login",  # invalid_authorization_specification
    "28P01": "the server refused the password",  # invalid_password
}
# psycopg reports failures while connecting with libpq's text alone (no SQLSTATE):
# the server's FATAL line, in English unless the server's lc_messages says otherwise.
_LIBPQ_LOGIN_REFUSED = (
    (re.compile(r'FATAL:\s+database "[^"]*" does not exist'), "3D000"),
    (re.compile(r'FATAL:\s+role "[^"]*" does not exist'), "28000"),
    (re.compile(r'FATAL:\s+password authentication failed for user "[^"]*"'), "28P01"),
    (re.compile(r"FATAL:\s+no pg_hba\.conf entry for "), "28000"),
)


def refused_login(orig: object, sqlstate: object, text: str) -> str | None:
    """What does not exist, or refused, when a PostgreSQL login cannot succeed (None
    otherwise): the same answer on psycopg (sync and asyncio) and asyncpg.

    By SQLSTATE where the driver gives one (asyncpg, psycopg after connecting); for
    psycopg's connection-time failures, which carry no SQLSTATE, by the server's
    FATAL line in libpq's message. The message names the database or role the
    server named, never a password (the caller's subject shows the URL masked).
    """
    if sqlstate is None and _psycopg_error(orig, "OperationalError"):
        for pattern, code in _LIBPQ_LOGIN_REFUSED:
            found = pattern.search(str(orig))
            if found is not None:
                return (
                    f"{_SQLSTATE_LOGIN_REFUSED[code]} ({found[0].removeprefix('FATAL:').strip()})"
                )
        return None
    if not isinstance(sqlstate, str) or sqlstate not in _SQLSTATE_LOGIN_REFUSED:
        return None
    return f"{_SQLSTATE_LOGIN_REFUSED[sqlstate]} ({text})"


def _translate_mysql_error(
    exc: BaseException,
    code: int,
    orig: BaseException,
    subject: str,
    missing_run: str | None,
    waited: str,
) -> BaseException:
    text = str(orig.args[1]) if len(orig.args) > 1 else str(orig)
    if code == _MYSQL_FOREIGN_KEY and missing_run is not None:
        return RunNotFound(f"run {missing_run!r} not found")
    if code in _MYSQL_MISSING_SCHEMA:
        return _schema_out_of_date(subject)
    if code in _MYSQL_BUSY:
        return DatabaseBusy(f"{subject}: a lock held by another session was not released{waited}")
    if code in _MYSQL_BAD_VALUE:
        return ValueError(f"{subject}: the database refused a value: {text}")
    if code == _MYSQL_UNKNOWN_DATABASE:
        return ProjectionError(f"{subject}: the database does not exist ({text})")
    if code in _MYSQL_REFUSED_LOGIN:
        return ProjectionError(
            f"{subject}: the server refused the login ({text}); check the user, "
            "its password and its grants"
        )
    if code in _MYSQL_UNAVAILABLE or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return DatabaseUnavailable(f"{subject}: the database is unavailable: {text}")
    return ProjectionError(f"{subject}: {text}")


def _connection_failure(exc: BaseException, orig: Any) -> bool:
    """An OperationalError or InterfaceError: SQLAlchemy's wrapper, or psycopg's own
    when nothing wrapped it (cli/quick_revision connects with psycopg alone)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return _psycopg_error(orig, "OperationalError", "InterfaceError")


def _schema_out_of_date(subject: str) -> SchemaOutOfDate:
    return SchemaOutOfDate(
        f"the projection tables are missing or incomplete ({subject}); "
        "run `alembic upgrade head` or relay_flow_projection.upgrade()"
    )


def _retry_delay(exc: DBAPIError, attempt: int, connected: bool) -> float | None:
    """Seconds to pause before running a failed call again, or None: raise *exc*.

    Only failures after which nothing of the attempt committed are repeated
    (every write is idempotent, so the repeat repairs, never corrupts):
    * a call that had a connection and lost it: once, at once (the pool was
      invalidated with it, so the repeat gets a fresh connection). A failure
      to connect is not repeated: it would only double the wait.
    * a deadlock, which the server broke by rolling this transaction back:
      up to DEADLOCK_ATTEMPTS in all, after a random pause that grows, so
      that the same two transactions do not meet again in step.
    """
    if exc.connection_invalidated:
        return 0.0 if attempt == 1 and connected else None
    if attempt < DEADLOCK_ATTEMPTS and is_deadlock(exc.orig):
        return random.uniform(0.002, 0.01) * attempt
    return None


# ------------------------------------------------------- transactions ---


def run_in_transaction(conn: Connection, operation: Operation[T], budget: float) -> T:
    """Run *operation* on a checked-out connection: the code both facades share.

    *budget* is what is left of lock_timeout for this call, in seconds.
    """
    if not operation.writes:
        return operation.body(conn)  # conn comes from read_only_view(): no BEGIN
    if conn.dialect.name == "sqlite":
        with (
            _sqlite_busy_timeout(conn, budget),
            _sqlite_foreign_keys_off(conn) if operation.deletes_dependents else nullcontext(),
            conn.begin(),
        ):
            return operation.body(conn)
    with conn.begin():
        if conn.dialect.name == "postgresql":
            # An integer of milliseconds: nothing user-supplied reaches the text.
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(max(1, round(budget * 1000)))}")
        # MySQL/MariaDB: innodb_lock_wait_timeout is the session's, set when it
        # connected (engine.py); with no writer queue the budget is all of it.
        return operation.body(conn)


@contextmanager
def _sqlite_busy_timeout(conn: Connection, budget: float) -> Iterator[None]:
    """Shorten this connection's busy timeout by what the writer queue used.

    The connect listener set it to the whole lock_timeout; one ``PRAGMA`` on
    the pooled DBAPI connection (before ``BEGIN IMMEDIATE``, which is what
    waits) is needed only when the queue took a noticeable part of it.
    """
    full = lock_timeout_of(conn.engine)
    if full - budget < 0.001:
        yield
        return
    cursor = conn.connection.cursor()
    cursor.execute(busy_timeout_pragma(budget))
    try:
        yield
    finally:
        try:
            cursor.execute(busy_timeout_pragma(full))
            cursor.close()
        except Exception:
            # The connection died with the transaction (or a cancelled task's
            # cleanup closed it): it must not return to the pool with the
            # shortened timeout.
            conn.invalidate()


FOREIGN_KEYS_PRAGMA = "PRAGMA foreign_keys"
FOREIGN_KEYS_OFF = "PRAGMA foreign_keys = OFF"
FOREIGN_KEYS_ON = "PRAGMA foreign_keys = ON"


@contextmanager
def _sqlite_foreign_keys_off(conn: Connection) -> Iterator[None]:
    """Foreign keys off for one transaction whose body deletes dependent rows itself.

    Deleting a parent row makes SQLite look up every child table for rows
    still referring to it, one index search per table and row, even when the
    transaction has just deleted them (the retention sweep: about 15% of its
    CPU time). ``PRAGMA foreign_keys`` only changes outside a transaction, so it
    is set before ``BEGIN`` and restored after the commit or rollback; a
    connection whose setting cannot be restored is invalidated, never pooled.
    Other connections keep enforcing: the write lock keeps their writes out
    of this transaction.
    """
    cursor = conn.connection.cursor()
    cursor.execute(FOREIGN_KEYS_PRAGMA)
    row = cursor.fetchone()
    enforced = row is not None and bool(row[0])
    if not enforced:
        cursor.close()
        yield
        return
    cursor.execute(FOREIGN_KEYS_OFF)
    try:
        yield
    finally:
        try:
            cursor.execute(FOREIGN_KEYS_ON)
            cursor.close()
        except Exception:
            conn.invalidate()


class FairLock:
    """A first-come, first-served lock: release hands it to the longest waiter.

    ``threading.Lock`` lets the releasing thread take the lock straight back
    (it is already running; the woken waiter is not), so a thread that writes
    in a loop -- the retention sweep, batch after batch -- starved the other
    writers for many batches in a row. Here a waiter never loses its turn.
    """

    __slots__ = ("_guard", "_held", "_waiters")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Lock] = deque()

    def acquire(self, timeout: float) -> bool:
        with self._guard:
            if not self._held:
                self._held = True
                return True
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        if turn.acquire(timeout=timeout):
            return True  # release() handed the lock over
        with self._guard:
            if turn in self._waiters:
                self._waiters.remove(turn)
                return False
        # release() handed it over just as the wait timed out: it is ours.
        turn.acquire()
        return True

    def release(self) -> None:
        with self._guard:
            if self._waiters:
                self._waiters.popleft().release()  # still held: by the next waiter now
            else:
                self._held = False


# SQLite writers of one process queue on one lock per connection pool (every
# view of an engine shares its pool). As the Go code's mutex did, this turns
# lock waits inside busy_timeout into a fair queue (FIELD-NOTES: worst wait
# under 2 processes x 4 threads ~2 s -> ~0.4 s). asyncio writers queue on an
# asyncio.Lock per pool and event loop (asyncio.Lock is first-come,
# first-served already).
_thread_locks: weakref.WeakKeyDictionary[Pool, FairLock] = weakref.WeakKeyDictionary()
_task_locks: weakref.WeakKeyDictionary[
    Pool, weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]
] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()
# Engines whose pooled connections a forked child must not reuse.
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _thread_lock(pool: Pool) -> FairLock:
    with _locks_guard:
        lock = _thread_locks.get(pool)
        if lock is None:
            lock = _thread_locks[pool] = FairLock()
        return lock


def _task_lock(pool: Pool) -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    with _locks_guard:
        per_loop = _task_locks.get(pool)
        if per_loop is None:
            per_loop = _task_locks[pool] = weakref.WeakKeyDictionary()
        lock = per_loop.get(loop)
        if lock is None:
            lock = per_loop[loop] = asyncio.Lock()
        return lock


def track_for_fork(engine: Engine) -> None:
    """Make *engine* safe to use in a child after ``os.fork()`` (see _after_fork_in_child)."""
    _engines.add(engine)


def _after_fork_in_child() -> None:
    """A forked child starts with fresh pools and unlocked writer queues.

    ``dispose(close=False)`` is SQLAlchemy's documented recipe: the child
    drops its references to the inherited connections without closing them,
    so the parent's sockets and transactions stay intact. A writer lock
    another parent thread held at the fork would never be released here.
    """
    global _locks_guard
    _locks_guard = threading.Lock()
    _thread_locks.clear()
    _task_locks.clear()
    for engine in list(_engines):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _busy_message(subject: str, lock_timeout: float) -> DatabaseBusy:
    return DatabaseBusy(
        f"{subject}: another writer of this process kept the SQLite write lock "
        f"beyond lock_timeout ({lock_timeout:g} s)"
    )


class SyncExecutor:
    """Runs operations for ``RunProjection`` on one engine."""

    __slots__ = ("_engine", "_lock_timeout", "_pool", "_reader", "_sqlite")

    def __init__(self, engine: Engine) -> None:
        dialect_name(engine.dialect)  # refuse unsupported databases up front
        self._engine = engine
        self._reader = read_only_view(engine)
        self._lock_timeout = lock_timeout_of(engine)
        self._sqlite = engine.dialect.name == "sqlite"
        self._pool = engine.pool
        track_for_fork(engine)

    def run(self, operation: Operation[T]) -> T:
        try:
            with self._queue(operation) as budget:
                engine = self._engine if operation.writes else self._reader
                for attempt in itertools.count(1):
                    connected = False
                    try:
                        with engine.connect() as conn:
                            connected = True
                            return run_in_transaction(conn, operation, budget)
                    except DBAPIError as exc:
                        delay = _retry_delay(exc, attempt, connected)
                        if delay is None:
                            raise
                        time.sleep(delay)
                raise AssertionError("unreachable: every attempt returns or raises")
        except (SQLAlchemyError, sqlite3.Error, OSError) as exc:
            raise translate_error(
                exc,
                operation.subject,
                missing_run=operation.missing_run,
                lock_timeout=self._lock_timeout,
            ) from exc

    @contextmanager
    def _queue(self, operation: Operation[Any]) -> Iterator[float]:
        """Hold the SQLite writer queue (writes only); yield the lock budget left."""
        if not (operation.writes and self._sqlite):
            yield self._lock_timeout
            return
        lock = _thread_lock(self._pool)
        started = time.monotonic()
        if not lock.acquire(timeout=self._lock_timeout):
            raise _busy_message(operation.subject, self._lock_timeout)
        try:
            yield max(0.001, self._lock_timeout - (time.monotonic() - started))
        finally:
            lock.release()


class AsyncExecutor:
    """Runs operations for ``AsyncRunProjection`` on one ``AsyncEngine``.

    The operation body is the synchronous one ``SyncExecutor`` runs, driven by
    ``AsyncConnection.run_sync``: SQLAlchemy runs it in a greenlet whose
    every database call awaits the async driver on this event loop.
    """

    __slots__ = ("_engine", "_lock_timeout", "_pool", "_reader", "_sqlite")

    def __init__(self, engine: AsyncEngine) -> None:
        from sqlalchemy.ext.asyncio import AsyncEngine

        sync_engine = engine.sync_engine
        dialect_name(sync_engine.dialect)
        self._engine = engine
        self._reader = AsyncEngine(read_only_view(sync_engine))
        self._lock_timeout = lock_timeout_of(sync_engine)
        self._sqlite = sync_engine.dialect.name == "sqlite"
        self._pool = sync_engine.pool
        track_for_fork(sync_engine)

    async def run(self, operation: Operation[T]) -> T:
        """Run *operation*; a cancelled caller gets CancelledError once the call has ended.

        The call runs in a task of its own, shielded from the caller's
        cancellation: a transaction abandoned half-way would leave its
        connection to SQLAlchemy's cancellation clean-up, which closes it in the
        background while it may still hold SQLite's write lock or an open
        server transaction. The call therefore commits or rolls back (it is an
        idempotent activity, so having committed is harmless) and returns its
        connection first; only then does the cancellation go on. A cancelled
        call thus ends within its own duration, which lock_timeout bounds.
        """
        call = asyncio.ensure_future(self._run(operation))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            while not call.done():
                try:
                    await asyncio.shield(call)
                except asyncio.CancelledError:
                    continue  # cancelled again: still wait for the call to end
                except BaseException:
                    break
            if not call.cancelled():
                call.exception()  # its outcome is nobody's now; mark it retrieved
            raise

    async def _run(self, operation: Operation[T]) -> T:
        try:
            if operation.writes and self._sqlite:
                return await self._run_queued(operation)
            return await self._attempt(operation, self._lock_timeout)
        except (SQLAlchemyError, sqlite3.Error, OSError) as exc:
            raise translate_error(
                exc,
                operation.subject,
                missing_run=operation.missing_run,
                lock_timeout=self._lock_timeout,
            ) from exc

    async def _run_queued(self, operation: Operation[T]) -> T:
        """A SQLite write: wait for this pool's writer queue, then run with the budget left."""
        lock = _task_lock(self._pool)
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._lock_timeout):
                await lock.acquire()
        except TimeoutError:
            raise _busy_message(operation.subject, self._lock_timeout) from None
        try:
            budget = max(0.001, self._lock_timeout - (time.monotonic() - started))
            return await self._attempt(operation, budget)
        finally:
            lock.release()

    async def _attempt(self, operation: Operation[T], budget: float) -> T:
        """Check a connection out, run the operation's transaction on it, check it back in.

        ``AsyncConnection.start()`` / ``close()`` rather than ``async with``:
        the context manager's exit runs ``close()`` in a task of its own, shielded
        from cancellation, and this whole call already is such a task (see
        ``run``); a second task per call cost two more trips through the event loop.
        """
        engine = self._engine if operation.writes else self._reader
        for attempt in itertools.count(1):
            connected = False
            try:
                conn = await engine.connect().start()
                connected = True
                try:
                    return await conn.run_sync(run_in_transaction, operation, budget)
                finally:
                    await conn.close()
            except DBAPIError as exc:
                delay = _retry_delay(exc, attempt, connected)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: every attempt returns or raises")
