"""The bare-Core floor: the layer's own Core statements on a plain SQLAlchemy engine.

What the layer cannot do without, so what its overhead is measured against
(issue 21): ``sqlalchemy.create_engine(url)`` with no listeners and default
options, except the driver settings the layer's engine passes to the driver
(``connect_args``: psycopg's ``prepare_threshold=None``, asyncpg's disabled
statement caches, PyMySQL's utf8mb4 and timeouts -- taken from
``engine.engine_arguments`` itself), connections opened once and held for the
whole measurement (no pool checkout, no reset on return), and per call:

- a write: one transaction, ``with conn.begin():`` the layer's statements,
  started as the layer starts it (``BEGIN IMMEDIATE`` on SQLite, ``SET LOCAL
  lock_timeout`` first on PostgreSQL -- on psycopg in one query with ``BEGIN``
  on an ``AUTOCOMMIT`` writer, ended by a ``COMMIT`` statement --, nothing on
  MySQL);
- a read: one ``conn.execute`` on an ``AUTOCOMMIT`` connection: no ``BEGIN``,
  no ``ROLLBACK``, no transaction bookkeeping.

The statements are the layer's own objects (``statements.py``: ``GET_RUN``,
``insert_start(dialect)``, ``UPDATE_CURRENT_NODE``, ...) with the parameter
dictionaries ``operations.py`` builds, and rows are mapped by the same
``row_to_run``. What is left out is what the layer adds around them: argument
validation, ``Operation`` objects, the executor (SQLite writer queue, retry,
error translation), the pool checkout where the layer still makes one (asyncio,
MySQL) and the per-connection options, the listeners.

Reads and writes hold one connection each (as ``raw.py`` does): on one
connection a read would either open a transaction (psycopg sends ``BEGIN``
before it, and something must end it) or switch the connection's isolation
level per call -- the very bookkeeping the floor leaves out. Session settings
the listeners would make (the pragmas, ``SET TIME ZONE 'UTC'``, MySQL's
session variables) are set once on each held connection.

``BareCoreAsync`` is the same for ``AsyncConnection``: each call is one
``run_sync`` of the same functions, the layer's own way into SQLAlchemy's
sync execution (one greenlet switch per call; see ``operations.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as sqlalchemy_async_engine

from relay_flow_projection import statements as sql
from relay_flow_projection.dialect import child_insert_locks_parent, dialect_name, folds_begin
from relay_flow_projection.engine import (
    BUSY_TIMEOUT_MS,
    JOURNAL_SIZE_LIMIT,
    engine_arguments,
    resolve_target,
)
from relay_flow_projection.execution import DEFAULT_LOCK_TIMEOUT
from relay_flow_projection.models import NodeSessionRegistration, Run, RunStart, RunState

SQLITE_SESSION = (
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys = ON",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}",
)
POSTGRES_SESSION = ("SET TIME ZONE 'UTC'",)
MYSQL_SESSION = (
    "SET SESSION time_zone = '+00:00', sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', "
    f"innodb_lock_wait_timeout = {round(DEFAULT_LOCK_TIMEOUT)}, "
    f"lock_wait_timeout = {round(DEFAULT_LOCK_TIMEOUT)}",
)
SET_LOCK_TIMEOUT = f"SET LOCAL lock_timeout = {round(DEFAULT_LOCK_TIMEOUT * 1000)}"


def driver_settings(target: str, *, asynchronous: bool = False) -> tuple[URL, dict[str, Any]]:
    """The URL and the driver arguments the layer's engine would use for *target*.

    Only ``connect_args`` is kept (and, for async SQLite, the aiosqlite driver):
    no execution options, no isolation level, no pool settings.
    """
    resolved = resolve_target(target)
    url, kwargs = engine_arguments(
        resolved, lock_timeout=DEFAULT_LOCK_TIMEOUT, connect_timeout=10.0, engine_kwargs={}
    )
    if asynchronous and url.get_backend_name() == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    settings = {"connect_args": kwargs["connect_args"]} if "connect_args" in kwargs else {}
    return url, settings


def prepare(conn: Connection, *, reader: bool) -> None:
    """Once per held connection: what the layer's connect listener sets, and the
    connection's transaction mode (readers in AUTOCOMMIT)."""
    family = dialect_name(conn.dialect)
    if family == "sqlite":
        # What engine.py's connect listener does: SQLAlchemy's pysqlite then
        # sends no BEGIN of its own, and writes send BEGIN IMMEDIATE.
        conn.connection.dbapi_connection.isolation_level = None  # type: ignore[union-attr]
    if reader or folds_begin(conn.dialect):
        conn.execution_options(isolation_level="AUTOCOMMIT")
    elif family == "mysql":
        conn.execution_options(isolation_level="READ COMMITTED")  # engine.py's choice
    session = {"sqlite": SQLITE_SESSION, "postgresql": POSTGRES_SESSION}.get(family, MYSQL_SESSION)
    for statement in session:
        conn.exec_driver_sql(statement)
    if not reader:
        conn.commit()


@contextmanager
def _write(conn: Connection) -> Iterator[None]:
    """One write transaction, begun and ended as the layer's (execution.run_in_transaction)."""
    family = dialect_name(conn.dialect)
    folded = folds_begin(conn.dialect)  # psycopg: the writer is in AUTOCOMMIT (prepare)
    with conn.begin():
        if family == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # engine.py's begin listener
        elif family == "postgresql":
            conn.exec_driver_sql(f"BEGIN; {SET_LOCK_TIMEOUT}" if folded else SET_LOCK_TIMEOUT)
        yield
        if folded:
            conn.exec_driver_sql("COMMIT")


# --- the operations, on a held Connection (statements and parameters as operations.py) ---


def insert_start(conn: Connection, start: RunStart, now: datetime) -> None:
    params = {
        "id": start.id,
        "logical_run_id": start.logical_id or start.id,
        "attempt_id": start.attempt_id or 1,
        "repo": start.repo,
        "workflow": start.workflow,
        "ticket_id": start.ticket_id,
        "ticket_key": start.ticket_key,
        "state": RunState.STARTING.value,
        "now": now,
    }
    with _write(conn):
        conn.execute(sql.insert_start(conn.dialect.name), params)


def update_node(
    conn: Connection, run_id: str, state: RunState, node: str, visit_id: str, now: datetime
) -> None:
    params = {"run": run_id, "state": state.value, "node_name": node, "visit": visit_id, "now": now}
    with _write(conn):
        if conn.execute(sql.UPDATE_CURRENT_NODE, params).rowcount != 1:
            raise LookupError(run_id)
        conn.execute(sql.upsert_node_visit(conn.dialect.name), params)


def get_run(conn: Connection, run_id: str) -> Run:
    row = conn.execute(sql.GET_RUN, {"run": run_id}).first()
    if row is None:
        raise LookupError(run_id)
    return sql.row_to_run(row)


def register_node_session(
    conn: Connection, registration: NodeSessionRegistration, now: datetime
) -> bool:
    params = {
        "run": registration.run_id,
        "node_name": registration.node,
        "session": registration.session_id,
        "now": now,
    }
    with _write(conn):
        if child_insert_locks_parent(conn.dialect):
            conn.execute(sql.LOCK_RUN, params)
        current = conn.execute(sql.LOCK_CURRENT_VISIT, params).scalar_one_or_none()
        if current is None:
            return False
        bound = {**params, "visit": current}
        conn.execute(sql.insert_session_once(conn.dialect.name), bound)
        if conn.execute(sql.SESSION_FIRST_VISIT, bound).scalar_one() != current:
            return False
        return bool(conn.execute(sql.BIND_SESSION, bound).rowcount == 1)


def list_active_workflow(conn: Connection, workflow: str) -> list[Run]:
    return sql.list_runs(conn, None, workflow, None, True, None, None)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class BareCore:
    """The bare-Core floor for the sync facade (implements ``raw.RawDriver``)."""

    def __init__(self, target: str, **connect_args: Any) -> None:
        self.sql: dict[str, str] = {}  # raw.RawDriver's attribute; the statements are Core's
        self.clock: Callable[[], datetime] = _utc_now
        url, settings = driver_settings(target)
        if connect_args:
            settings["connect_args"] = {**settings.get("connect_args", {}), **connect_args}
        self.engine: Engine = sqlalchemy.create_engine(url, **settings)
        self.writer = self.engine.connect()
        self.reader = self.engine.connect()
        prepare(self.writer, reader=False)
        prepare(self.reader, reader=True)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()
        self.engine.dispose()

    def connections(self) -> list[Any]:
        """The DBAPI connections (raw.verify_same_sql traces them)."""
        return [c.connection.driver_connection for c in (self.reader, self.writer)]

    def insert_start(self, start: RunStart, now: datetime) -> None:
        insert_start(self.writer, start, now)

    def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        update_node(self.writer, run_id, state, node, visit_id, self.clock())

    def get_run(self, run_id: str) -> Run:
        return get_run(self.reader, run_id)

    def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        return register_node_session(self.writer, registration, self.clock())

    def list_active_workflow(self, workflow: str) -> list[Run]:
        return list_active_workflow(self.reader, workflow)


class BareCoreAsync:
    """The bare-Core floor for the async facade: held ``AsyncConnection`` objects, one
    ``run_sync`` of the same functions per call (implements ``raw_async.RawAsyncDriver``)."""

    def __init__(self, engine: AsyncEngine, writer: AsyncConnection, reader: AsyncConnection):
        self.driver = engine.sync_engine.dialect.driver
        self.clock: Callable[[], datetime] = _utc_now
        self.engine = engine
        self.writer = writer
        self.reader = reader

    @classmethod
    async def open(cls, target: str) -> BareCoreAsync:
        url, settings = driver_settings(target, asynchronous=True)
        engine = sqlalchemy_async_engine(url, **settings)
        writer = await engine.connect()
        reader = await engine.connect()
        await writer.run_sync(prepare, reader=False)
        await reader.run_sync(prepare, reader=True)
        return cls(engine, writer, reader)

    async def close(self) -> None:
        await self.reader.close()
        await self.writer.close()
        await self.engine.dispose()

    async def insert_start(self, start: RunStart, now: datetime) -> None:
        await self.writer.run_sync(insert_start, start, now)

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        await self.writer.run_sync(update_node, run_id, state, node, visit_id, self.clock())

    async def get_run(self, run_id: str) -> Run:
        return await self.reader.run_sync(get_run, run_id)

    async def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        return await self.writer.run_sync(register_node_session, registration, self.clock())
