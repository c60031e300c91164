"""How every operation runs: its transaction, one retry after a dropped connection,
the SQLite writer queue and lock timeouts. Driver errors are translated in
driver_errors.py; the operations themselves are in operations.py.

An operation (``operations.Operation``) is a function of a SQLAlchemy
``Connection`` plus what it is about. ``run_in_transaction`` is the part both
facades share: it opens the transaction an operation needs and runs its body.
``SyncExecutor`` and ``AsyncExecutor`` differ only in how they wait -- for the
SQLite writer queue and for a connection -- and the async one reaches the same
``run_in_transaction`` in a greenlet (``AsyncSession.run_sync``) that awaits
the async driver.

Everything here uses documented SQLAlchemy APIs only: ``Engine.connect``,
``Engine.execution_options``, ``Connection.begin``, ``Connection.execute`` /
``exec_driver_sql``, ``Connection.connection`` (the pooled DBAPI connection, for
one ``PRAGMA`` before ``BEGIN``), ``DBAPIError.orig`` and
``DBAPIError.connection_invalidated``, ``Pool`` identity,
``AsyncSession.run_sync`` (only to run a function in a greenlet),
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
  PgBouncer carries to the server connection that runs the statements
  (psycopg sends it in the BEGIN's round trip: dialect.folds_begin). On
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

Only a connection lost *before* COMMIT was sent is retried that way: the
server rolls back what it had. One lost while COMMIT was on its way
(``_committed`` raises ``CommitOutcomeUnknown``) may have committed, and a
blind retry could answer wrongly or overwrite what another caller wrote
meanwhile (API.md, *Ambiguous commits*). An operation that can find out reads
the outcome on a new connection (``Operation.settle``: the sweep asks whether
its batch's runs still exist); any other raises ``DatabaseUnavailable`` saying
the outcome is unknown.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import Pool

from .dialect import (
    dialect_name,
    folds_begin,
    keeps_between_calls,
    read_options,
    write_options,
)
from .driver_errors import CommitOutcomeUnknown, is_deadlock, translate_error
from .errors import DatabaseBusy
from .held_connection import HeldConnection, LoopHeldConnection
from .operations import Operation

if TYPE_CHECKING:  # the asyncio extension loads only for the async facade
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

# Calls run again after a deadlock the server broke, in all (see _retry_delay).
DEADLOCK_ATTEMPTS = 4

# The execution option create_engine() stores lock_timeout under; an engine
# made elsewhere gets the API's default.
LOCK_TIMEOUT_OPTION = "relay_lock_timeout"
DEFAULT_LOCK_TIMEOUT = 30.0


def busy_timeout_pragma(seconds: float) -> str:
    """SQLite's lock wait for *seconds* (at least 1 ms: 0 would mean "fail at once")."""
    return f"PRAGMA busy_timeout = {int(max(1, round(seconds * 1000)))}"


def lock_timeout_of(engine: Engine) -> float:
    value = engine.get_execution_options().get(LOCK_TIMEOUT_OPTION, DEFAULT_LOCK_TIMEOUT)
    return float(value)


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
        return operation.body(conn)  # conn has read_options(): no BEGIN
    if conn.dialect.name == "sqlite":
        full = lock_timeout_of(conn.engine)
        if full - budget < 0.001 and not operation.deletes_dependents:
            return _committed(conn, operation.body)  # no pragma to change: the usual write
        with (
            _sqlite_busy_timeout(conn, budget, full),
            _sqlite_foreign_keys_off(conn) if operation.deletes_dependents else nullcontext(),
        ):
            return _committed(conn, operation.body)
    if conn.dialect.name == "postgresql":
        # psycopg: conn has write_options(), autocommit; BEGIN travels with
        # the setting and COMMIT is ours to send (dialect.folds_begin). An
        # integer of milliseconds: nothing user-supplied reaches the text.
        folded = folds_begin(conn.dialect)
        opening = (
            f"{'BEGIN; ' if folded else ''}"
            f"SET LOCAL lock_timeout = {int(max(1, round(budget * 1000)))}"
        )

        def body(conn: Connection) -> T:
            conn.exec_driver_sql(opening)
            return operation.body(conn)

        return _committed(conn, body, send_commit=folded)
    # MySQL/MariaDB: innodb_lock_wait_timeout is the session's, set when it
    # connected (engine.py); with no writer queue the budget is all of it.
    return _committed(conn, operation.body)


def _committed(conn: Connection, body: Callable[[Connection], T], send_commit: bool = False) -> T:
    """Run *body* in one transaction and commit it, telling a lost COMMIT apart.

    A connection that dies while the body runs leaves nothing committed (the
    server rolls an unfinished transaction back), so the executor may run the
    call again. One that dies once COMMIT is sent leaves the outcome unknown:
    that is ``CommitOutcomeUnknown``, which is never retried blindly.
    *send_commit*: the transaction was begun by the body's own ``BEGIN`` on an
    autocommit connection, so ``COMMIT`` is sent here (the context manager's
    commit then finds nothing to do).
    """
    # The commit stays with the transaction's context manager, which rolls a
    # failed commit back; the flag tells a failure of COMMIT from one of the body.
    body_done = False
    try:
        with conn.begin():
            result = body(conn)
            body_done = True
            if send_commit:
                conn.exec_driver_sql("COMMIT")
    except DBAPIError as exc:
        if body_done and exc.connection_invalidated:
            raise CommitOutcomeUnknown(exc) from exc
        raise
    return result


@contextmanager
def _sqlite_busy_timeout(conn: Connection, budget: float, full: float) -> Iterator[None]:
    """Shorten this connection's busy timeout (*full*: lock_timeout) by what the
    writer queue used.

    The connect listener set it to the whole lock_timeout; one ``PRAGMA`` on
    the pooled DBAPI connection (before ``BEGIN IMMEDIATE``, which is what
    waits) is needed only when the queue took a noticeable part of it.
    """
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

    __slots__ = ("__weakref__", "_engine", "_lock_timeout", "_roles", "_sqlite")

    def __init__(self, engine: Engine) -> None:
        dialect_name(engine.dialect)  # refuse unsupported databases up front
        self._engine = engine
        self._roles = _Roles(engine.dialect, lambda keeps: HeldConnection(engine, enabled=keeps))
        self._lock_timeout = lock_timeout_of(engine)
        self._sqlite = engine.dialect.name == "sqlite"
        track_for_fork(engine)
        # An executor dropped without close() still ends what it holds.
        weakref.finalize(self, self._roles.release_for_good)

    def close(self) -> None:
        """Return the held connections; later calls check one out per call."""
        self._roles.release_for_good()

    def run(self, operation: Operation[T]) -> T:
        try:
            if operation.writes and self._sqlite:
                return self._run_queued(operation)
            return self._attempts(operation, self._lock_timeout)
        except (SQLAlchemyError, sqlite3.Error, OSError, CommitOutcomeUnknown) as exc:
            raise translate_error(
                exc,
                operation.subject,
                missing_run=operation.missing_run,
                lock_timeout=self._lock_timeout,
            ) from exc

    def _run_queued(self, operation: Operation[T]) -> T:
        """A SQLite write: wait for this pool's writer queue, then run with the budget left."""
        lock = _thread_lock(self._engine.pool)
        started = time.monotonic()
        if not lock.acquire(timeout=self._lock_timeout):
            raise _busy_message(operation.subject, self._lock_timeout)
        try:
            budget = max(0.001, self._lock_timeout - (time.monotonic() - started))
            return self._attempts(operation, budget)
        finally:
            lock.release()

    def _attempts(self, operation: Operation[T], budget: float) -> T:
        """Run the operation's transaction (``_on_held_connection``), repeating it after
        a dropped connection or a deadlock (``_retry_delay``)."""
        for attempt in itertools.count(1):
            progress = _Progress()
            try:
                return _on_held_connection(
                    self._engine, self._roles, attempt > 1, progress, operation, budget
                )
            except CommitOutcomeUnknown as lost:
                if operation.settle is None or attempt > 1:
                    raise
                settled = self._settle(operation.settle, lost)
                if settled is not None:
                    return settled
                # It did not commit: the next attempt is its one retry.
            except DBAPIError as exc:
                delay = _retry_delay(exc, attempt, progress.connected)
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable: every attempt returns or raises")

    def _settle(
        self, settle: Callable[[Connection], T | None], lost: CommitOutcomeUnknown
    ) -> T | None:
        """What a write whose COMMIT was lost did, read on a new connection."""
        try:
            return _on_own_connection(self._engine, self._roles.read_options, settle)
        except DBAPIError:
            raise lost from None  # still unknown


class _Roles:
    """Reads and writes: the options of each one's connections and the connection
    each one's last call used, kept for the next (held_connection.py)."""

    __slots__ = ("read_options", "reader", "write_options", "writer")

    def __init__(self, dialect: Dialect, slot: Callable[[bool], HeldConnection]) -> None:
        """*slot(enabled)*: the executor's kind of HeldConnection, one per role."""
        self.read_options = read_options(dialect)
        self.write_options = write_options(dialect)
        keeps = keeps_between_calls(dialect)
        self.reader = slot(keeps)
        self.writer = slot(keeps)

    def release(self) -> None:
        """Return what both hold: after an outage, which may have broken it too."""
        self.reader.release()
        self.writer.release()

    def release_for_good(self) -> None:
        self.reader.release(for_good=True)
        self.writer.release(for_good=True)


def _on_held_connection(
    engine: Engine,
    roles: _Roles,
    repeat: bool,
    progress: _Progress,
    operation: Operation[T],
    budget: float,
) -> T:
    """One attempt of *operation*, the part both executors share (the async one in a
    greenlet): on the connection its role holds if that may serve the call, else on
    one checked out; then kept for the role's next call, or returned.

    A *repeat* never reuses: the pool gives it a fresh connection.
    """
    held, options = (
        (roles.writer, roles.write_options)
        if operation.writes
        else (roles.reader, roles.read_options)
    )
    conn, lease = (None, held.lease()) if repeat else held.take()
    if conn is None:
        conn = _checked_out(engine, options)
    progress.connected = True
    try:
        result = run_in_transaction(conn, operation, budget)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            roles.release()
        raise
    if not held.put(conn, lease):
        conn.close()
    return result


def _checked_out(engine: Engine, options: Mapping[str, Any]) -> Connection:
    """A connection from *engine*'s pool with *options* (dialect.read_options / write_options)."""
    conn = engine.connect()
    if options:
        try:
            conn.execution_options(**options)
        except BaseException:
            conn.close()
            raise
    return conn


class _Progress:
    """How far an attempt got: whether it had a connection (``_retry_delay``)."""

    __slots__ = ("connected",)

    def __init__(self) -> None:
        self.connected = False


def _on_own_connection(
    engine: Engine, options: Mapping[str, Any], body: Callable[[Connection], T]
) -> T:
    """Check a connection out of *engine*, run *body* on it, return it to the pool:
    either executor's settling read."""
    with _checked_out(engine, options) as conn:
        return body(conn)


class AsyncExecutor:
    """Runs operations for ``AsyncRunProjection`` on one ``AsyncEngine``.

    The operation body is the synchronous one ``SyncExecutor`` runs, in a
    greenlet (``AsyncSession.run_sync``) whose every database call awaits the
    async driver on this event loop.
    """

    __slots__ = ("_engine", "_greenlets", "_lock_timeout", "_roles", "_sqlite")

    def __init__(self, engine: AsyncEngine) -> None:
        sync_engine = engine.sync_engine
        dialect_name(sync_engine.dialect)
        self._engine = engine
        from sqlalchemy.ext.asyncio import AsyncSession  # loaded with the async facade only

        # Only its run_sync is used, never the session: SQLAlchemy's public way to
        # run a function in a greenlet that awaits the async driver on this loop
        # without checking a connection out first (see _in_greenlet).
        self._greenlets = greenlets = AsyncSession()
        self._roles = _Roles(
            sync_engine.dialect,
            lambda keeps: LoopHeldConnection(sync_engine, enabled=keeps, greenlets=greenlets),
        )
        self._lock_timeout = lock_timeout_of(sync_engine)
        self._sqlite = sync_engine.dialect.name == "sqlite"
        track_for_fork(sync_engine)

    async def close(self) -> None:
        """Return the held connections; later calls check one out per call."""
        await self._in_greenlet(self._roles.release_for_good)

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
        except (SQLAlchemyError, sqlite3.Error, OSError, CommitOutcomeUnknown) as exc:
            raise translate_error(
                exc,
                operation.subject,
                missing_run=operation.missing_run,
                lock_timeout=self._lock_timeout,
            ) from exc

    async def _run_queued(self, operation: Operation[T]) -> T:
        """A SQLite write: wait for this pool's writer queue, then run with the budget left."""
        lock = _task_lock(self._engine.sync_engine.pool)
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
        """Run the operation's transaction (``_on_held_connection``) in a greenlet,
        repeating it as the sync executor does (``_retry_delay``)."""
        sync_engine = self._engine.sync_engine
        for attempt in itertools.count(1):
            progress = _Progress()
            try:
                return await self._in_greenlet(
                    _on_held_connection,
                    sync_engine,
                    self._roles,
                    attempt > 1,
                    progress,
                    operation,
                    budget,
                )
            except CommitOutcomeUnknown as lost:
                if operation.settle is None or attempt > 1:
                    raise
                settled = await self._settle(operation.settle, lost)
                if settled is not None:
                    return settled
                # It did not commit: the next attempt is its one retry.
            except DBAPIError as exc:
                delay = _retry_delay(exc, attempt, progress.connected)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: every attempt returns or raises")

    async def _settle(
        self, settle: Callable[[Connection], T | None], lost: CommitOutcomeUnknown
    ) -> T | None:
        """What a write whose COMMIT was lost did, read on a new connection."""
        try:
            return await self._in_greenlet(
                _on_own_connection, self._engine.sync_engine, self._roles.read_options, settle
            )
        except DBAPIError:
            raise lost from None  # still unknown

    async def _in_greenlet(self, body: Callable[..., T], *args: Any) -> T:
        """``body(*args)`` in a greenlet whose database calls await the async driver.

        An attempt's checkout, transaction and check-in all run in one:
        ``AsyncConnection.start()``, ``run_sync()`` and ``close()`` would each start
        a greenlet and go round the event loop (17% more CPU per ``get_run`` on
        psycopg: issue 21).
        """
        return await self._greenlets.run_sync(lambda _session: body(*args))
