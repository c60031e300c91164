"""``RunProjection``: the public facade. Each method is one transaction.

The facade validates arguments, owns the transaction, and translates driver
errors into the exceptions of API.md; the statements themselves live in
``statements.py``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import statements as sql
from . import validation as check
from .dialect import (
    dialect_name,
    driver_reads_in_autocommit,
    driver_write_begin,
    is_foreign_key_violation,
    own_begin_listeners,
    read_only_view,
)
from .errors import (
    IdentityMismatch,
    IdentityMissing,
    NodeRuntimeNotFound,
    NodeVisitNotCurrent,
    ProjectionError,
    RunNotFound,
    SchemaOutOfDate,
)
from .identity import validate_identity
from .models import (
    ExecutorIdentity,
    NodeRuntime,
    NodeSessionRegistration,
    RetryStatus,
    Run,
    RunFilter,
    RunStart,
    RunState,
)
from .timestamps import require_aware

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


# One writer per process and engine, as the Go code's mutex gave it: on SQLite
# this turns lock waits inside busy_timeout into a fair in-process queue (worst
# wait under 2 processes x 4 threads: ~2 s -> ~0.4 s, FIELD-NOTES).
_engine_write_locks: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()
_engine_write_locks_guard = threading.Lock()


def _write_lock_for(engine: Engine) -> threading.Lock | None:
    if dialect_name(engine.dialect) != "sqlite":
        return None  # PostgreSQL writers lock rows, not the database
    with _engine_write_locks_guard:
        lock = _engine_write_locks.get(engine)
        if lock is None:
            lock = _engine_write_locks[engine] = threading.Lock()
        return lock


def _is_missing_table(exc: DBAPIError) -> bool:
    orig: Any = exc.orig
    return getattr(orig, "sqlstate", None) == "42P01" or "no such table" in str(orig)


class _Boundary:
    """Translate driver errors raised inside a ``with`` block into API.md errors.

    *subject* names what the call was about ("run 'r1'", "node 'n' of run 'r1'")
    so every message says which run, node or visit was involved.
    """

    __slots__ = ("fk_means_missing_run", "run_id", "subject")

    def __init__(self, subject: str, run_id: str | None = None) -> None:
        self.subject = subject
        self.run_id = run_id
        self.fk_means_missing_run = run_id is not None

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not isinstance(exc, DBAPIError):
            return
        if self.fk_means_missing_run and is_foreign_key_violation(exc):
            raise RunNotFound(f"run {self.run_id!r} not found") from exc
        if _is_missing_table(exc):
            raise SchemaOutOfDate(
                f"the projection tables are missing or incomplete ({self.subject}); "
                "run `alembic upgrade head` or relay_flow_projection.upgrade()"
            ) from exc
        raise ProjectionError(f"{self.subject}: {exc.orig}") from exc


class RunProjection:
    """The run projection repository on one engine (see API.md for each method)."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        dialect_name(engine.dialect)  # refuse unsupported databases up front
        self._engine = engine
        self._reader = read_only_view(engine)
        self._clock: Clock = clock or utc_now
        self._write_lock = _write_lock_for(engine)
        # The lean path (single-row methods) needs an engine without execution
        # options, which it would not apply; hooks are checked at every call.
        self._lean = _Lean(engine, self._write_lock) if not engine.get_execution_options() else None
        self._begin_listeners = own_begin_listeners(engine.dialect)

    @property
    def engine(self) -> Engine:
        return self._engine

    def _now(self) -> datetime:
        return require_aware(self._clock(), "clock()")

    def _read(self) -> Any:
        return self._reader.connect()

    def _write(self) -> _WriteTransaction:
        return _WriteTransaction(self._engine, self._write_lock)

    def _lean_read(self) -> Any:
        """``_read()`` for prepared single-row statements, on the bare DBAPI connection."""
        if self._lean is not None and _uninstrumented(self._engine, self._begin_listeners):
            return _LeanTransaction(self._lean, read=True)
        return self._read()

    def _lean_write(self) -> Any:
        """``_write()`` for prepared single-row statements, on the bare DBAPI connection."""
        if self._lean is not None and _uninstrumented(self._engine, self._begin_listeners):
            return _LeanTransaction(self._lean, read=False)
        return self._write()

    # ------------------------------------------------------------ runs ---

    def insert_start(self, start: RunStart, now: datetime) -> None:
        run_id = check.required_text(start.id, "run id")
        params = {
            "id": run_id,
            "logical_run_id": check.plain_text(start.logical_id, "logical_id") or run_id,
            "attempt_id": check.non_negative(start.attempt_id, "attempt_id") or 1,
            "repo": check.plain_text(start.repo, "repo"),
            "workflow": check.plain_text(start.workflow, "workflow"),
            "ticket_id": check.plain_text(start.ticket_id, "ticket_id", key=False),
            "ticket_key": check.plain_text(start.ticket_key, "ticket_key"),
            "state": RunState.STARTING.value,
            "now": require_aware(now, "now"),
        }
        with _Boundary(f"insert_start of run {run_id!r}"), self._lean_write() as conn:
            conn.execute(sql.insert_start(conn.dialect), params)

    def update_state(
        self,
        run_id: str,
        state: RunState | str,
        last_error: str | None = None,
        finished_at: datetime | None = None,
    ) -> None:
        new_state = check.run_state(state)
        params = {
            "run": check.required_text(run_id, "run_id"),
            "state": new_state.value,
            "last_error": check.optional_text(last_error, "last_error", key=False),
            "finished_at": None
            if finished_at is None
            else require_aware(finished_at, "finished_at"),
            "now": self._now(),
        }
        statement = sql.UPDATE_STATE_TERMINAL if new_state.is_terminal else sql.UPDATE_STATE
        self._update_run(run_id, statement, params, "update_state")

    def update_retry(self, run_id: str, status: RetryStatus | None) -> None:
        params: dict[str, Any] = {"run": check.required_text(run_id, "run_id"), "now": self._now()}
        if status is None:
            statement = sql.CLEAR_RETRY
        else:
            statement = sql.SET_RETRY
            params["retry_attempt"] = check.non_negative(status.attempt, "retry attempt")
            params["retry_error"] = check.plain_text(
                status.last_error, "retry last_error", key=False
            )
            params["next_retry_at"] = require_aware(status.next_retry_at, "next_retry_at")
        self._update_run(run_id, statement, params, "update_retry")

    def _update_run(self, run_id: str, statement: Any, params: dict[str, Any], what: str) -> None:
        with _Boundary(f"{what} of run {run_id!r}"), self._lean_write() as conn:
            if conn.execute(statement, params).rowcount != 1:
                raise RunNotFound(f"run {run_id!r} not found")

    def update_node(self, run_id: str, state: RunState | str, node: str, visit_id: str) -> None:
        params = {
            "run": check.required_text(run_id, "run_id"),
            "state": check.run_state(state).value,
            "node_name": check.required_text(node, "node"),
            "visit": check.required_text(visit_id, "visit_id", key=False),
            "now": self._now(),
        }
        subject = f"update_node of run {run_id!r} node {node!r} visit {visit_id!r}"
        with _Boundary(subject, run_id), self._lean_write() as conn:
            # The run row first: on PostgreSQL its row lock orders concurrent
            # update_node calls on one run; on SQLite the write lock is held.
            if conn.execute(sql.UPDATE_CURRENT_NODE, params).rowcount != 1:
                raise RunNotFound(f"run {run_id!r} not found")
            # A revisit changes only the visit; terminal and session ids stay.
            conn.execute(sql.upsert_node_visit(conn.dialect), params)

    def get_run(self, run_id: str) -> Run:
        check.plain_text(run_id, "run_id")
        return self._find_run(sql.GET_RUN, {"run": run_id}, f"run {run_id!r}")

    def find_run_by_ticket(self, ticket_key: str) -> Run:
        check.plain_text(ticket_key, "ticket_key")
        return self._find_run(
            sql.FIND_RUN_BY_TICKET, {"key": ticket_key}, f"run for ticket {ticket_key!r}"
        )

    def find_run_by_logical_id(self, logical_id: str) -> Run:
        check.plain_text(logical_id, "logical_id")
        return self._find_run(
            sql.FIND_RUN_BY_LOGICAL_ID, {"key": logical_id}, f"run with logical id {logical_id!r}"
        )

    def _find_run(self, statement: Any, params: dict[str, str], subject: str) -> Run:
        with _Boundary(f"reading {subject}"), self._lean_read() as conn:
            row = conn.execute(statement, params).first()
        if row is None:
            raise RunNotFound(f"{subject} not found")
        return sql.row_to_run(row)

    def list_runs(
        self, filter: RunFilter | None = None, *, limit: int | None = None, after: Run | None = None
    ) -> list[Run]:
        wanted = _checked_filter(filter)
        if limit is not None:
            check.non_negative(limit, "limit")
            if limit == 0:
                return []
        with _Boundary("list_runs"), self._read() as conn:
            return sql.list_runs(
                conn, wanted.repo, wanted.workflow, wanted.ticket, wanted.active, after, limit
            )

    def iter_runs(self, filter: RunFilter | None = None, *, batch_size: int = 500) -> Iterator[Run]:
        check.positive(batch_size, "batch_size")
        return self._iter_runs(_checked_filter(filter), batch_size)

    def _iter_runs(self, filter: RunFilter | None, batch_size: int) -> Iterator[Run]:
        after: Run | None = None
        while True:
            page = self.list_runs(filter, limit=batch_size, after=after)
            yield from page
            if len(page) < batch_size:
                return
            after = page[-1]

    def count_runs(self, filter: RunFilter | None = None) -> dict[RunState, int]:
        wanted = _checked_filter(filter)
        with _Boundary("count_runs"), self._read() as conn:
            return sql.count_runs(conn, wanted.repo, wanted.workflow, wanted.ticket, wanted.active)

    def has_active_workflow(self, workflow: str) -> bool:
        check.plain_text(workflow, "workflow")
        return self._exists(sql.HAS_ACTIVE_WORKFLOW, {"value": workflow}, f"workflow {workflow!r}")

    def has_active_repo(self, repo: str) -> bool:
        check.plain_text(repo, "repo")
        return self._exists(sql.HAS_ACTIVE_REPO, {"value": repo}, f"repo {repo!r}")

    def _exists(self, statement: Any, params: dict[str, str], subject: str) -> bool:
        with _Boundary(f"reading {subject}"), self._lean_read() as conn:
            return bool(conn.execute(statement, params).scalar_one())

    def sweep_retention(self, older_than: datetime, *, batch_size: int = 1000) -> list[str]:
        batches = self.sweep_retention_batches(older_than, batch_size=batch_size)
        return [run_id for batch in batches for run_id in batch]

    def sweep_retention_batches(
        self, older_than: datetime, *, batch_size: int = 1000
    ) -> Iterator[list[str]]:
        """sweep_retention one committed batch at a time (for progress reporting)."""
        cutoff = require_aware(older_than, "older_than")
        size = check.positive(batch_size, "batch_size")
        return self._sweep_batches(cutoff, size)

    def _sweep_batches(self, cutoff: datetime, size: int) -> Iterator[list[str]]:
        while True:
            with _Boundary("sweep_retention"), self._write() as conn:
                batch = sql.sweep_batch(conn, cutoff, size)
            if batch:
                yield batch
            if len(batch) < size:
                return

    def count_sweepable(self, older_than: datetime) -> int:
        params = {"older_than": require_aware(older_than, "older_than")}
        with _Boundary("count_sweepable"), self._read() as conn:
            return int(conn.execute(sql.COUNT_SWEEPABLE, params).scalar_one())

    # --------------------------------------------------- node runtimes ---

    def get_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        check.plain_text(run_id, "run_id")
        check.plain_text(node, "node")
        subject = f"node {node!r} of run {run_id!r}"
        with _Boundary(f"reading {subject}"), self._lean_read() as conn:
            row = conn.execute(sql.GET_NODE_RUNTIME, {"run": run_id, "node_name": node}).first()
        if row is None:
            raise NodeRuntimeNotFound(f"no runtime binding for {subject}")
        return sql.row_to_node_runtime(row)

    def load_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        try:
            return self.get_node_runtime(run_id, node)
        except NodeRuntimeNotFound:
            return NodeRuntime(run_id=run_id, node=node)

    def update_node_runtime(self, runtime: NodeRuntime) -> None:
        params = {
            "run": check.required_text(runtime.run_id, "run_id"),
            "node_name": check.required_text(runtime.node, "node"),
            "terminal": check.optional_text(runtime.terminal_id, "terminal_id", key=False),
            "session": check.optional_text(runtime.session_id, "session_id", key=False),
            # None is the empty binding's visit: as empty as "".
            "visit": check.required_text(runtime.node_visit_id or "", "node_visit_id", key=False),
            "now": self._now(),
        }
        subject = f"update_node_runtime of run {runtime.run_id!r} node {runtime.node!r}"
        with _Boundary(subject, runtime.run_id), self._lean_write() as conn:
            conn.execute(sql.upsert_node_runtime(conn.dialect), params)

    def update_node_runtime_visit(self, run_id: str, node: str, visit_id: str) -> None:
        params = {
            "run": check.required_text(run_id, "run_id"),
            "node_name": check.required_text(node, "node"),
            "visit": check.required_text(visit_id, "visit_id", key=False),
            "now": self._now(),
        }
        subject = f"update_node_runtime_visit of run {run_id!r} node {node!r} visit {visit_id!r}"
        with _Boundary(subject, run_id), self._lean_write() as conn:
            conn.execute(sql.upsert_node_visit(conn.dialect), params)

    def node_runtime_visit_is_current(self, run_id: str, node: str, visit_id: str) -> bool:
        params = {
            "run": check.plain_text(run_id, "run_id"),
            "node_name": check.plain_text(node, "node"),
            "visit": check.plain_text(visit_id, "visit_id", key=False),
        }
        return self._exists(sql.NODE_VISIT_IS_CURRENT, params, f"node {node!r} of run {run_id!r}")

    def replace_node_runtime(
        self,
        run_id: str,
        node: str,
        visit_id: str,
        terminal_id: str | None,
        previous_session_id: str | None,
        session_id: str | None,
    ) -> None:
        params = {
            "run": check.required_text(run_id, "run_id"),
            "node_name": check.required_text(node, "node"),
            "visit": check.required_text(visit_id, "visit_id", key=False),
            "terminal": check.optional_text(terminal_id, "terminal_id", key=False),
            # None (or '') matches a binding that has no session.
            "previous": check.optional_text(previous_session_id, "previous_session_id", key=False)
            or "",
            "session": check.optional_text(session_id, "session_id", key=False),
            "now": self._now(),
        }
        subject = f"node {node!r} of run {run_id!r} visit {visit_id!r}"
        with _Boundary(f"replace_node_runtime of {subject}"), self._lean_write() as conn:
            if conn.execute(sql.REPLACE_NODE_RUNTIME, params).rowcount != 1:
                raise NodeVisitNotCurrent(f"{subject} is not the current visit")

    def clear_node_runtime(
        self, run_id: str, node: str, *, clear_terminal: bool, clear_session: bool
    ) -> None:
        params = {
            "run": check.required_text(run_id, "run_id"),
            "node_name": check.required_text(node, "node"),
            "now": self._now(),
        }
        statement = sql.clear_node_runtime(bool(clear_terminal), bool(clear_session))
        with (
            _Boundary(f"clear_node_runtime of node {node!r} of run {run_id!r}"),
            self._lean_write() as conn,
        ):
            conn.execute(statement, params)

    def list_node_runtimes(self, run_id: str) -> list[NodeRuntime]:
        check.plain_text(run_id, "run_id")
        with _Boundary(f"reading node runtimes of run {run_id!r}"), self._lean_read() as conn:
            rows = conn.execute(sql.LIST_NODE_RUNTIMES, {"run": run_id})
            return [sql.row_to_node_runtime(row) for row in rows]

    def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        params = {
            "run": check.required_text(registration.run_id, "run_id"),
            "node_name": check.required_text(registration.node, "node"),
            "session": check.required_text(registration.session_id, "session_id"),
            "now": self._now(),
        }
        subject = (
            f"register_node_session of session {registration.session_id!r} "
            f"for node {registration.node!r} of run {registration.run_id!r}"
        )
        with _Boundary(subject), self._lean_write() as conn:
            current = conn.execute(sql.LOCK_CURRENT_VISIT, params).scalar_one_or_none()
            if current is None:
                return False
            params["visit"] = current
            # The first registration records the visit the session belongs to.
            conn.execute(sql.insert_session_once(conn.dialect), params)
            first_seen = conn.execute(sql.SESSION_FIRST_VISIT, params).scalar_one()
            if first_seen != current:
                return False  # a session of an earlier visit never binds to a later one
            return bool(conn.execute(sql.BIND_SESSION, params).rowcount == 1)

    # --------------------------------------------------------- reports ---

    def has_processed_report(self, run_id: str, report_id: str) -> bool:
        params = {
            "run": check.plain_text(run_id, "run_id"),
            "report": check.plain_text(report_id, "report_id"),
        }
        return self._exists(
            sql.HAS_PROCESSED_REPORT, params, f"report {report_id!r} of run {run_id!r}"
        )

    def record_processed_report(self, run_id: str, visit_id: str, report_id: str) -> None:
        params = {
            "run": check.required_text(run_id, "run_id"),
            "visit": check.required_text(visit_id, "visit_id", key=False),
            "report": check.required_text(report_id, "report_id"),
            "now": self._now(),
        }
        subject = f"record_processed_report {report_id!r} of run {run_id!r} visit {visit_id!r}"
        with _Boundary(subject, run_id), self._lean_write() as conn:
            conn.execute(sql.record_processed_report(conn.dialect), params)

    # -------------------------------------------------------- identity ---

    def identity(self) -> ExecutorIdentity | None:
        with _Boundary("reading the executor identity"), self._lean_read() as conn:
            row = conn.execute(sql.READ_IDENTITY).first()
        return None if row is None else sql.row_to_identity(row)

    def initialize_identity(self, identity: ExecutorIdentity) -> None:
        validate_identity(identity)
        params = {
            "executor_plugin": identity.executor_plugin,
            "temporal_address": identity.temporal_address or None,
            "temporal_namespace": identity.temporal_namespace or None,
        }
        with _Boundary("initialize_identity"), self._lean_write() as conn:
            # Insert-if-absent, then compare: of concurrent initializers exactly
            # one writes the marker and every other one verifies against it.
            conn.execute(sql.insert_identity_once(conn.dialect), params)
            persisted = sql.row_to_identity(conn.execute(sql.READ_IDENTITY).one())
        _require_same_identity(identity, persisted)

    def verify_identity(self, identity: ExecutorIdentity) -> None:
        validate_identity(identity)
        persisted = self.identity()
        if persisted is None:
            if identity.executor_plugin != "goworkflows":
                raise IdentityMissing(
                    "the database has no executor identity marker; a Temporal installation "
                    "requires one written by init_database_with_identity"
                )
            # A legacy marker-less home is adopted by the embedded executor.
            self.initialize_identity(identity)
            return
        _require_same_identity(identity, persisted)


def _checked_filter(filter: RunFilter | None) -> RunFilter:
    """The filter, or "any"; its text is refused on NUL as every argument is."""
    wanted = filter or RunFilter()
    for name in ("repo", "workflow", "ticket"):
        value = getattr(wanted, name)
        if value is not None:
            check.plain_text(value, name)
    return wanted


def _require_same_identity(configured: ExecutorIdentity, persisted: ExecutorIdentity) -> None:
    if configured != persisted:
        raise IdentityMismatch(
            f"executor identity mismatch: configured={configured} persisted={persisted}"
        )


class _WriteTransaction:
    """``engine.begin()`` behind the per-engine writer lock (SQLite only)."""

    __slots__ = ("_begin", "_engine", "_lock")

    def __init__(self, engine: Engine, lock: threading.Lock | None) -> None:
        self._engine = engine
        self._lock = lock
        self._begin: Any = None

    def __enter__(self) -> Connection:
        if self._lock is not None:
            self._lock.acquire()
        try:
            self._begin = self._engine.begin()
            return self._begin.__enter__()  # type: ignore[no-any-return]
        except BaseException:
            if self._lock is not None:
                self._lock.release()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._begin.__exit__(kind, exc, tb)
        finally:
            if self._lock is not None:
                self._lock.release()


# SQLAlchemy hooks that observe statement execution (events on the engine, its
# dialect's handle_error, SQL logging): the lean path would bypass them, so it
# is taken only while none is in use.


def _uninstrumented(engine: Engine, begin_listeners: int) -> bool:
    d: Any = engine.dispatch
    return not (
        d.before_cursor_execute
        or d.after_cursor_execute
        or d.before_execute
        or d.after_execute
        or d.commit
        or d.rollback
        or d.engine_connect
        or len(d.begin) != begin_listeners
        or engine.dialect.dispatch.handle_error
        or engine._should_log_info()
    )


def _driver_error(exc: Exception, statement: str, params: Any, dialect: Any) -> Exception:
    """The driver's exception wrapped as SQLAlchemy wraps it (IntegrityError, ...)."""
    return DBAPIError.instance(statement, params, exc, dialect.loaded_dbapi.Error, dialect=dialect)


class _Lean:
    """What lean transactions of one projection share (computed once)."""

    __slots__ = ("autocommit_reads", "begin", "dialect", "error", "lock", "pool", "prepared")

    def __init__(self, engine: Engine, lock: threading.Lock | None) -> None:
        dialect: Any = engine.dialect
        self.dialect = dialect
        self.pool = engine.pool
        self.lock = lock
        self.error: type[Exception] = dialect.loaded_dbapi.Error
        self.begin = driver_write_begin(dialect)
        self.autocommit_reads = driver_reads_in_autocommit(dialect)
        # Statements are long-lived constants: each is compiled once per projection.
        self.prepared: dict[Any, sql.Prepared] = {}


class _LeanConnection:
    """``execute`` of prepared statements on one DBAPI cursor (see statements.Prepared)."""

    __slots__ = ("_cursor", "_lean", "dialect")

    def __init__(self, cursor: Any, lean: _Lean) -> None:
        self._cursor = cursor
        self._lean = lean
        self.dialect = lean.dialect

    def execute(self, statement: Any, parameters: dict[str, Any] | None = None) -> sql.LeanResult:
        lean = self._lean
        prepared = lean.prepared.get(statement)
        if prepared is None:
            prepared = lean.prepared[statement] = sql.Prepared(statement, lean.dialect)
        values = prepared.parameters(parameters or {})
        cursor = self._cursor
        try:
            cursor.execute(prepared.sql, values)
            fetched = cursor.fetchall() if prepared.returns_rows else []
        except lean.error as exc:
            raise _driver_error(exc, prepared.sql, values, lean.dialect) from exc
        return sql.LeanResult(prepared.rows(fetched), cursor.rowcount)


class _LeanTransaction:
    """One transaction (or one autocommit read) on a pooled DBAPI connection.

    The same work as ``_WriteTransaction`` / ``RunProjection._read()``: the
    writer lock (SQLite), BEGIN IMMEDIATE (SQLite) or the driver's implicit
    BEGIN (PostgreSQL), commit or rollback; reads issue no BEGIN (SQLite) or
    run in autocommit (PostgreSQL). Driver errors are wrapped as SQLAlchemy
    wraps them, and a lost connection is invalidated in the pool.
    """

    __slots__ = ("_cursor", "_driver", "_fairy", "_lean", "_lock", "_read")

    def __init__(self, lean: _Lean, *, read: bool) -> None:
        self._lean = lean
        self._read = read
        self._lock = None if read else lean.lock
        self._fairy: Any = None
        self._driver: Any = None
        self._cursor: Any = None

    def __enter__(self) -> _LeanConnection:
        lean = self._lean
        if self._lock is not None:
            self._lock.acquire()
        statement = "(connect)"
        try:
            self._fairy = lean.pool.connect()
            driver = self._driver = self._fairy.driver_connection
            if self._read:
                if lean.autocommit_reads:
                    driver.autocommit = True
                self._cursor = driver.cursor()
            else:
                self._cursor = driver.cursor()
                if lean.begin is not None:
                    statement = lean.begin
                    self._cursor.execute(statement)
        except BaseException as exc:
            self._release(exc)
            if isinstance(exc, lean.error):
                raise _driver_error(exc, statement, (), lean.dialect) from exc
            raise
        return _LeanConnection(self._cursor, lean)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            self._release(exc)
            return
        try:
            self._cursor.close()
            if self._read:
                if self._lean.autocommit_reads:
                    self._driver.autocommit = False
            else:
                self._driver.commit()
        except BaseException as failure:
            self._release(failure)
            if isinstance(failure, self._lean.error):
                raise _driver_error(failure, "COMMIT", (), self._lean.dialect) from failure
            raise
        self._fairy.close()
        if self._lock is not None:
            self._lock.release()

    def _release(self, exc: BaseException) -> None:
        """After a failure: roll back (or leave autocommit), return the connection, unlock."""
        fairy = self._fairy
        lean = self._lean
        try:
            if fairy is None:
                return
            orig = exc.orig if isinstance(exc, DBAPIError) else exc
            if isinstance(orig, lean.error) and lean.dialect.is_disconnect(
                orig, self._driver, self._cursor
            ):
                fairy.invalidate(orig)
            else:
                try:
                    if self._cursor is not None:
                        self._cursor.close()
                    if self._read:
                        if lean.autocommit_reads:
                            self._driver.autocommit = False
                    else:
                        self._driver.rollback()
                except lean.error as failure:
                    fairy.invalidate(failure)
            fairy.close()
        finally:
            if self._lock is not None:
                self._lock.release()
