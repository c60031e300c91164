"""The raw-driver baselines: what the layer does, written directly on sqlite3 / psycopg.

Same SQL text as the layer sends (``verify_same_sql`` compares them, statement by
statement, against what the layer's cursor executes), same connection settings
(the project's pragmas; autocommit reads, ``BEGIN IMMEDIATE`` writes behind an
in-process writer lock on SQLite; implicit-BEGIN writes and autocommit reads on
PostgreSQL), same timestamp conversion and the same row-to-dataclass mapping
(``statements.row_to_run``); on PostgreSQL each write transaction starts with
``SET LOCAL lock_timeout`` as execution.py's ``run_in_transaction`` does.
What the raw code does not do is what the layer adds: argument validation,
connection pooling, statement compilation/caching, result processing, error
translation.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg
from sqlalchemy.engine import Engine

from relay_flow_projection import RunProjection
from relay_flow_projection.engine import BUSY_TIMEOUT_MS, JOURNAL_SIZE_LIMIT
from relay_flow_projection.execution import DEFAULT_LOCK_TIMEOUT
from relay_flow_projection.models import NodeSessionRegistration, Run, RunStart, RunState
from relay_flow_projection.statements import row_to_run
from relay_flow_projection.timestamps import parse_stored_text, to_storage_text

_RUN_SELECT = (
    "SELECT relay_runs.id, relay_runs.logical_run_id, relay_runs.attempt_id, relay_runs.repo, "
    "relay_runs.workflow, relay_runs.ticket_id, relay_runs.ticket_key, relay_runs.state, "
    "relay_runs.current_node, relay_runs.current_node_visit_id, relay_runs.last_error, "
    "relay_runs.retry_error, relay_runs.retry_attempt, relay_runs.next_retry_at, "
    "relay_runs.started_at, relay_runs.updated_at, relay_runs.finished_at \nFROM relay_runs \n"
)
_TIMESTAMP_POSITIONS = (13, 14, 15, 16)
# execution.py's first statement of every PostgreSQL write transaction: the
# lock budget as a transaction-scoped setting (the only kind a transaction-
# pooling PgBouncer carries to the server connection that runs the writes).
SET_LOCK_TIMEOUT = f"SET LOCAL lock_timeout = {round(DEFAULT_LOCK_TIMEOUT * 1000)}"
# psycopg: how the layer opens a write on its autocommit connection (dialect.folds_begin).
BEGIN_WITH_LOCK_TIMEOUT = f"BEGIN; {SET_LOCK_TIMEOUT}"

SQLITE = {
    "insert_start": (
        "INSERT INTO relay_runs (id, logical_run_id, attempt_id, repo, workflow, ticket_id, "
        "ticket_key, state, started_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO NOTHING"
    ),
    "update_run_node": (
        "UPDATE relay_runs SET state=?, current_node=?, current_node_visit_id=?, updated_at=? "
        "WHERE relay_runs.id = ?"
    ),
    "upsert_node_visit": (
        "INSERT INTO relay_node_runtime (run_id, node, node_visit_id, updated_at) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (run_id, node) DO UPDATE SET "
        "node_visit_id = excluded.node_visit_id, updated_at = excluded.updated_at"
    ),
    "get_run": _RUN_SELECT + "WHERE relay_runs.id = ?",
    "lock_current_visit": (
        "SELECT relay_node_runtime.node_visit_id \nFROM relay_node_runtime \n"
        "WHERE relay_node_runtime.run_id = ? AND relay_node_runtime.node = ?"
    ),
    "insert_session_once": (
        "INSERT INTO relay_node_sessions (run_id, node, session_id, node_visit_id, created_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, node, session_id) DO NOTHING"
    ),
    "session_first_visit": (
        "SELECT relay_node_sessions.node_visit_id \nFROM relay_node_sessions \n"
        "WHERE relay_node_sessions.run_id = ? AND relay_node_sessions.node = ? "
        "AND relay_node_sessions.session_id = ?"
    ),
    "bind_session": (
        "UPDATE relay_node_runtime SET session_id=?, updated_at=? "
        "WHERE relay_node_runtime.run_id = ? AND relay_node_runtime.node = ? "
        "AND relay_node_runtime.node_visit_id = ?"
    ),
    "list_active_workflow": (
        _RUN_SELECT + "WHERE relay_runs.workflow = ? AND (relay_runs.state NOT IN "
        "('canceled', 'completed')) ORDER BY relay_runs.started_at, relay_runs.id"
    ),
}

POSTGRESQL = {
    "insert_start": (
        "INSERT INTO relay_runs (id, logical_run_id, attempt_id, repo, workflow, ticket_id, "
        "ticket_key, state, started_at, updated_at) VALUES (%(id)s::VARCHAR, "
        "%(logical_run_id)s::VARCHAR, %(attempt_id)s::INTEGER, %(repo)s::VARCHAR, "
        "%(workflow)s::VARCHAR, %(ticket_id)s::VARCHAR, %(ticket_key)s::VARCHAR, "
        "%(state)s::VARCHAR, %(now)s::TIMESTAMP WITH TIME ZONE, %(now)s::TIMESTAMP WITH TIME "
        "ZONE) ON CONFLICT (id) DO NOTHING"
    ),
    "update_run_node": (
        "UPDATE relay_runs SET state=%(state)s::VARCHAR, current_node=%(node_name)s::VARCHAR, "
        "current_node_visit_id=%(visit)s::VARCHAR, updated_at=%(now)s::TIMESTAMP WITH TIME "
        "ZONE WHERE relay_runs.id = %(run)s::VARCHAR"
    ),
    "upsert_node_visit": (
        "INSERT INTO relay_node_runtime (run_id, node, node_visit_id, updated_at) VALUES "
        "(%(run)s::VARCHAR, %(node_name)s::VARCHAR, %(visit)s::VARCHAR, %(now)s::TIMESTAMP "
        "WITH TIME ZONE) ON CONFLICT (run_id, node) DO UPDATE SET node_visit_id = "
        "excluded.node_visit_id, updated_at = excluded.updated_at"
    ),
    "get_run": _RUN_SELECT + ("WHERE relay_runs.id = %(run)s::VARCHAR"),
    "lock_current_visit": (
        "SELECT relay_node_runtime.node_visit_id \nFROM relay_node_runtime \nWHERE "
        "relay_node_runtime.run_id = %(run)s::VARCHAR AND relay_node_runtime.node = "
        "%(node_name)s::VARCHAR FOR UPDATE"
    ),
    "insert_session_once": (
        "INSERT INTO relay_node_sessions (run_id, node, session_id, node_visit_id, created_at) "
        "VALUES (%(run)s::VARCHAR, %(node_name)s::VARCHAR, %(session)s::VARCHAR, "
        "%(visit)s::VARCHAR, %(now)s::TIMESTAMP WITH TIME ZONE) ON CONFLICT (run_id, node, "
        "session_id) DO NOTHING"
    ),
    "session_first_visit": (
        "SELECT relay_node_sessions.node_visit_id \nFROM relay_node_sessions \nWHERE "
        "relay_node_sessions.run_id = %(run)s::VARCHAR AND relay_node_sessions.node = "
        "%(node_name)s::VARCHAR AND relay_node_sessions.session_id = %(session)s::VARCHAR"
    ),
    "bind_session": (
        "UPDATE relay_node_runtime SET session_id=%(session)s::VARCHAR, "
        "updated_at=%(now)s::TIMESTAMP WITH TIME ZONE WHERE relay_node_runtime.run_id = "
        "%(run)s::VARCHAR AND relay_node_runtime.node = %(node_name)s::VARCHAR AND "
        "relay_node_runtime.node_visit_id = %(visit)s::VARCHAR"
    ),
    "list_active_workflow": _RUN_SELECT
    + (
        "WHERE relay_runs.workflow = %(workflow)s::VARCHAR AND (relay_runs.state NOT IN "
        "('canceled', 'completed')) ORDER BY relay_runs.started_at, relay_runs.id"
    ),
}


def sqlite_start_params(start: RunStart, now: datetime) -> tuple[Any, ...]:
    """insert_start's positional parameters on SQLite (timestamps as the layer stores them)."""
    stamp = to_storage_text(now.astimezone(UTC))
    return (
        start.id,
        start.logical_id or start.id,
        start.attempt_id or 1,
        start.repo,
        start.workflow,
        start.ticket_id,
        start.ticket_key,
        RunState.STARTING.value,
        stamp,
        stamp,
    )


def postgres_node_params(
    run_id: str, state: RunState, node: str, visit_id: str, now: datetime
) -> dict[str, Any]:
    """update_node's named parameters on PostgreSQL."""
    return {
        "run": run_id,
        "state": state.value,
        "node_name": node,
        "visit": visit_id,
        "now": now.astimezone(UTC),
    }


def postgres_registration_params(
    registration: NodeSessionRegistration, now: datetime
) -> dict[str, Any]:
    """register_node_session's named parameters on PostgreSQL."""
    return {
        "run": registration.run_id,
        "node_name": registration.node,
        "session": registration.session_id,
        "now": now.astimezone(UTC),
    }


def postgres_start_params(start: RunStart, now: datetime) -> dict[str, Any]:
    """insert_start's named parameters on PostgreSQL."""
    return {
        "id": start.id,
        "logical_run_id": start.logical_id or start.id,
        "attempt_id": start.attempt_id or 1,
        "repo": start.repo,
        "workflow": start.workflow,
        "ticket_id": start.ticket_id,
        "ticket_key": start.ticket_key,
        "state": RunState.STARTING.value,
        "now": now.astimezone(UTC),
    }


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RawDriver(Protocol):
    sql: dict[str, str]
    clock: Callable[[], datetime]

    def insert_start(self, start: RunStart, now: datetime) -> None: ...
    def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None: ...
    def get_run(self, run_id: str) -> Run: ...
    def register_node_session(self, registration: NodeSessionRegistration) -> bool: ...
    def list_active_workflow(self, workflow: str) -> list[Run]: ...
    def close(self) -> None: ...
    def connections(self) -> list[Any]: ...


class RawSQLite:
    """sqlite3 with the project's pragmas; reads in autocommit, writes BEGIN IMMEDIATE."""

    sql = SQLITE

    def __init__(self, path: str) -> None:
        self.clock: Callable[[], datetime] = _utc_now
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in (
            f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
            "PRAGMA foreign_keys = ON",
            "PRAGMA journal_mode = WAL",
            "PRAGMA synchronous = NORMAL",
            f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}",
        ):
            self.connection.execute(pragma)
        self.lock = threading.Lock()

    def close(self) -> None:
        self.connection.close()

    def connections(self) -> list[Any]:
        return [self.connection]

    def _write(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self.lock:
            connection = self.connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                result = work(connection)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
            return result

    def insert_start(self, start: RunStart, now: datetime) -> None:
        params = sqlite_start_params(start, now)
        self._write(lambda c: c.execute(SQLITE["insert_start"], params))

    def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        stamp = to_storage_text(self.clock().astimezone(UTC))

        def work(c: sqlite3.Connection) -> None:
            cursor = c.execute(
                SQLITE["update_run_node"], (state.value, node, visit_id, stamp, run_id)
            )
            if cursor.rowcount != 1:
                raise LookupError(run_id)
            c.execute(SQLITE["upsert_node_visit"], (run_id, node, visit_id, stamp))

        self._write(work)

    def get_run(self, run_id: str) -> Run:
        row = self.connection.execute(SQLITE["get_run"], (run_id,)).fetchone()
        if row is None:
            raise LookupError(run_id)
        return _sqlite_row_to_run(row)

    def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        stamp = to_storage_text(self.clock().astimezone(UTC))
        run, node, session = registration.run_id, registration.node, registration.session_id

        def work(c: sqlite3.Connection) -> bool:
            found = c.execute(SQLITE["lock_current_visit"], (run, node)).fetchone()
            if found is None:
                return False
            visit = found[0]
            c.execute(SQLITE["insert_session_once"], (run, node, session, visit, stamp))
            first = c.execute(SQLITE["session_first_visit"], (run, node, session)).fetchone()[0]
            if first != visit:
                return False
            cursor = c.execute(SQLITE["bind_session"], (session, stamp, run, node, visit))
            return bool(cursor.rowcount == 1)

        return bool(self._write(work))

    def list_active_workflow(self, workflow: str) -> list[Run]:
        rows = self.connection.execute(SQLITE["list_active_workflow"], (workflow,))
        return [_sqlite_row_to_run(row) for row in rows]


def _sqlite_row_to_run(row: Sequence[Any]) -> Run:
    values = list(row)
    for position in _TIMESTAMP_POSITIONS:
        text = values[position]
        if text is not None:
            values[position] = parse_stored_text(text)
    return row_to_run(values)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _postgres_row_to_run(row: Sequence[Any]) -> Run:
    values = list(row)
    for position in _TIMESTAMP_POSITIONS:
        value = values[position]
        if value is not None:
            values[position] = _utc(value)
    return row_to_run(values)


class RawPostgres:
    """psycopg on autocommit connections: reads alone, writes as the layer sends them
    (``BEGIN; SET LOCAL lock_timeout``, the statements, ``COMMIT``).

    ``prepare_threshold=None`` (no server-side preparation) is the layer's
    pooler-safe setting (engine.py), so the baseline compares like with like;
    pass psycopg's own default (5) to measure what that setting costs.
    """

    sql = POSTGRESQL

    def __init__(self, conninfo: str, *, prepare_threshold: int | None = None) -> None:
        self.clock: Callable[[], datetime] = _utc_now
        self.reader = psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=prepare_threshold
        )
        self.writer = psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=prepare_threshold
        )
        for connection in (self.reader, self.writer):
            connection.execute("SET TIME ZONE 'UTC'")  # as engine.py's connect listener does

    def close(self) -> None:
        self.reader.close()
        self.writer.close()

    def connections(self) -> list[Any]:
        return [self.reader, self.writer]

    def _write(self, work: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        connection = self.writer  # autocommit: the transaction is the statements' own
        try:
            connection.execute(BEGIN_WITH_LOCK_TIMEOUT.encode())
            result = work(connection)
            connection.execute(b"COMMIT")
        except BaseException:
            connection.rollback()
            raise
        return result

    def insert_start(self, start: RunStart, now: datetime) -> None:
        params = postgres_start_params(start, now)
        self._write(lambda c: c.execute(POSTGRESQL["insert_start"], params))

    def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        params = postgres_node_params(run_id, state, node, visit_id, self.clock())

        def work(c: psycopg.Connection[Any]) -> None:
            if c.execute(POSTGRESQL["update_run_node"], params).rowcount != 1:
                raise LookupError(run_id)
            c.execute(POSTGRESQL["upsert_node_visit"], params)

        self._write(work)

    def get_run(self, run_id: str) -> Run:
        row = self.reader.execute(POSTGRESQL["get_run"], {"run": run_id}).fetchone()
        if row is None:
            raise LookupError(run_id)
        return _postgres_row_to_run(row)

    def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        params = postgres_registration_params(registration, self.clock())

        def work(c: psycopg.Connection[Any]) -> bool:
            found = c.execute(POSTGRESQL["lock_current_visit"], params).fetchone()
            if found is None:
                return False
            params["visit"] = visit = found[0]
            c.execute(POSTGRESQL["insert_session_once"], params)
            row = c.execute(POSTGRESQL["session_first_visit"], params).fetchone()
            if row is None or row[0] != visit:
                return False
            return bool(c.execute(POSTGRESQL["bind_session"], params).rowcount == 1)

        return bool(self._write(work))

    def list_active_workflow(self, workflow: str) -> list[Run]:
        rows = self.reader.execute(POSTGRESQL["list_active_workflow"], {"workflow": workflow})
        return [_postgres_row_to_run(row) for row in rows]


TRANSACTION_CONTROL = frozenset({"BEGIN IMMEDIATE", "BEGIN", "COMMIT", "ROLLBACK"})
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")

Trace = list[tuple[str, Any]]


class _RecordingCursor(psycopg.Cursor[Any]):
    trace: Trace

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        used = {name: params[name] for name in _PLACEHOLDER.findall(text)} if params else None
        self.trace.append((text, used))
        return super().execute(query, params, **kwargs)


@contextmanager
def _tracing(connections: list[Any], trace: Trace) -> Iterator[None]:
    """Record what the drivers execute: SQLite's expanded SQL, psycopg's query and values."""
    for connection in connections:
        if isinstance(connection, sqlite3.Connection):
            connection.set_trace_callback(lambda text: trace.append((text, None)))
        else:
            factory = type("Recording", (_RecordingCursor,), {"trace": trace})
            connection.cursor_factory = factory
    try:
        yield
    finally:
        for connection in connections:
            if isinstance(connection, sqlite3.Connection):
                connection.set_trace_callback(None)
            else:
                connection.cursor_factory = psycopg.Cursor


def verify_same_sql(
    engine: Engine,
    raw: RawDriver,
    layer_call: Callable[[RunProjection], object],
    raw_call: Callable[[RawDriver], object],
) -> Trace:
    """Fail loudly unless the layer sends what the raw baseline sends.

    Both run once with the same inputs and the same clock, each traced at the
    driver: on SQLite the expanded SQL (text and values, BEGIN and COMMIT
    included), on PostgreSQL each query's text and the values it uses. The
    layer's engine holds a single pooled connection here, so tracing it sees
    every statement the layer sends, whichever path the layer takes.
    """
    instant = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    engine.dispose()
    pooled = engine.raw_connection()
    driver = pooled.driver_connection
    pooled.close()
    layer_trace: Trace = []
    with _tracing([driver], layer_trace):
        layer_call(RunProjection(engine, clock=lambda: instant))
    raw_trace: Trace = []
    raw.clock = lambda: instant
    try:
        with _tracing(raw.connections(), raw_trace):
            raw_call(raw)
    finally:
        raw.clock = _utc_now
    if layer_trace != raw_trace or not layer_trace:
        raise AssertionError(
            f"the layer's SQL differs from the raw baseline's\nlayer: {layer_trace!r}\n"
            f"raw:   {raw_trace!r}"
        )
    return layer_trace
