"""The raw async-driver baselines: what ``AsyncRunProjection`` does, written on
aiosqlite, psycopg's asyncio mode and asyncpg directly.

The counterpart of ``raw.py`` for the asyncio facade. Each baseline sends
the layer's SQL text (the same dictionaries as ``raw.py``; for asyncpg the
same text with numbered ``$n`` placeholders, as SQLAlchemy's asyncpg dialect
renders it) with the same transactions: ``BEGIN IMMEDIATE`` writes behind an
asyncio writer lock and no ``BEGIN`` for reads on SQLite; on PostgreSQL
reads in autocommit and every write transaction starting with ``SET LOCAL
lock_timeout`` (psycopg: ``BEGIN; SET LOCAL lock_timeout`` in one query on
an autocommit connection, then ``COMMIT``, as the layer sends them).
Connection settings are the layer's: the project's pragmas on SQLite, ``SET
TIME ZONE 'UTC'`` on PostgreSQL, and the pooler-safe defaults
(``prepare_threshold=None`` for psycopg, ``statement_cache_size=0`` for
asyncpg). Rows are mapped by ``statements.row_to_run`` with the same
timestamp conversion. ``verify_same_sql_async`` traces both sides at the
driver and fails unless they send the same statements with the same values.

Each baseline uses its driver the way the driver's documentation shows:
``async with db.execute(...) as cursor`` on aiosqlite, ``await
conn.execute(...)`` / ``fetchone()`` on psycopg, ``conn.fetchrow`` /
``conn.execute`` inside ``conn.transaction()`` on asyncpg. What the raw code
does not do is what the layer adds: argument validation, the executor
(cancellation shield, retry, error translation), SQLAlchemy's connection pool
and asyncio adaptation (greenlets), statement compilation/caching and result
processing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

import aiosqlite
import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from relay_flow_projection import AsyncRunProjection, create_async_engine
from relay_flow_projection.engine import BUSY_TIMEOUT_MS, JOURNAL_SIZE_LIMIT
from relay_flow_projection.models import NodeSessionRegistration, Run, RunStart, RunState
from relay_flow_projection.timestamps import to_storage_text

from .raw import (
    BEGIN_WITH_LOCK_TIMEOUT,
    POSTGRESQL,
    SET_LOCK_TIMEOUT,
    SQLITE,
    _postgres_row_to_run,
    _sqlite_row_to_run,
    _utc_now,
    postgres_node_params,
    postgres_registration_params,
    postgres_start_params,
    sqlite_start_params,
)

DRIVERS = ("aiosqlite", "psycopg", "asyncpg")
_PYFORMAT = re.compile(r"%\((\w+)\)s")
SQLITE_PRAGMAS = (
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys = ON",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}",
)
UTC_SESSION = "SET TIME ZONE 'UTC'"  # engine.py's connect listener on PostgreSQL


def _numbered(text: str) -> tuple[str, tuple[str, ...]]:
    """``%(name)s`` placeholders as asyncpg's ``$n`` (a repeated name keeps its number)."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PYFORMAT.sub(number, text), tuple(order)


# name -> (SQL text, parameter names in $n order)
ASYNCPG = {name: _numbered(text) for name, text in POSTGRESQL.items()}


def async_url(target_url: str, driver: str) -> str:
    """The URL ``create_async_engine`` takes for *driver* (a SQLite path stays a path)."""
    if driver == "asyncpg":
        return target_url.replace("postgresql+psycopg://", "postgresql+asyncpg://", 1)
    return target_url


def asyncpg_dsn(conninfo_url: str) -> str:
    """A plain ``postgresql://`` DSN for asyncpg.connect from a SQLAlchemy URL."""
    return re.sub(r"^postgresql\+\w+://", "postgresql://", conninfo_url)


Trace = list[tuple[str, Any]]


class RawAsyncDriver(Protocol):
    driver: str
    clock: Callable[[], datetime]

    async def insert_start(self, start: RunStart, now: datetime) -> None: ...
    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None: ...
    async def get_run(self, run_id: str) -> Run: ...
    async def register_node_session(self, registration: NodeSessionRegistration) -> bool: ...
    async def close(self) -> None: ...


# ----------------------------------------------------------- aiosqlite ---


async def aiosqlite_connect(path: str) -> aiosqlite.Connection:
    connection = await aiosqlite.connect(path, isolation_level=None)
    for pragma in SQLITE_PRAGMAS:
        await connection.execute(pragma)
    return connection


class RawAiosqlite:
    """aiosqlite: reads without BEGIN, writes ``BEGIN IMMEDIATE`` behind an asyncio lock."""

    driver = "aiosqlite"

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self.clock: Callable[[], datetime] = _utc_now
        self.connection = connection
        self.lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str) -> RawAiosqlite:
        return cls(await aiosqlite_connect(path))

    async def close(self) -> None:
        await self.connection.close()

    async def _write(self, work: Callable[[aiosqlite.Connection], Awaitable[Any]]) -> Any:
        async with self.lock:
            connection = self.connection
            await connection.execute("BEGIN IMMEDIATE")
            try:
                result = await work(connection)
            except BaseException:
                await connection.execute("ROLLBACK")
                raise
            await connection.execute("COMMIT")
            return result

    async def _one(self, c: aiosqlite.Connection, name: str, params: Sequence[Any]) -> Any:
        async with c.execute(SQLITE[name], params) as cursor:
            return await cursor.fetchone()

    async def insert_start(self, start: RunStart, now: datetime) -> None:
        params = sqlite_start_params(start, now)

        async def work(c: aiosqlite.Connection) -> None:
            await c.execute(SQLITE["insert_start"], params)

        await self._write(work)

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        stamp = to_storage_text(self.clock().astimezone(UTC))

        async def work(c: aiosqlite.Connection) -> None:
            cursor = await c.execute(
                SQLITE["update_run_node"], (state.value, node, visit_id, stamp, run_id)
            )
            if cursor.rowcount != 1:
                raise LookupError(run_id)
            await c.execute(SQLITE["upsert_node_visit"], (run_id, node, visit_id, stamp))

        await self._write(work)

    async def get_run(self, run_id: str) -> Run:
        row = await self._one(self.connection, "get_run", (run_id,))
        if row is None:
            raise LookupError(run_id)
        return _sqlite_row_to_run(row)

    async def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        stamp = to_storage_text(self.clock().astimezone(UTC))
        run, node, session = registration.run_id, registration.node, registration.session_id

        async def work(c: aiosqlite.Connection) -> bool:
            found = await self._one(c, "lock_current_visit", (run, node))
            if found is None:
                return False
            visit = found[0]
            await c.execute(SQLITE["insert_session_once"], (run, node, session, visit, stamp))
            first = await self._one(c, "session_first_visit", (run, node, session))
            if first is None or first[0] != visit:
                return False
            cursor = await c.execute(SQLITE["bind_session"], (session, stamp, run, node, visit))
            return bool(cursor.rowcount == 1)

        return bool(await self._write(work))


# ------------------------------------------------------ psycopg asyncio ---


async def psycopg_connect(conninfo: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """A connection as the layer's engine makes it: no server-side preparation, UTC session."""
    connection = await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=None, **kwargs
    )
    await connection.execute(UTC_SESSION.encode())
    return connection


PsycopgConnection = psycopg.AsyncConnection[Any]


class RawPsycopgAsync:
    """psycopg's asyncio mode: reads on one autocommit connection, writes as the layer
    sends them on another (as ``raw.RawPostgres``)."""

    driver = "psycopg"

    def __init__(self, reader: PsycopgConnection, writer: PsycopgConnection) -> None:
        self.clock: Callable[[], datetime] = _utc_now
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, conninfo: str, **kwargs: Any) -> RawPsycopgAsync:
        reader = await psycopg_connect(conninfo, **kwargs)
        writer = await psycopg_connect(conninfo, **kwargs)
        return cls(reader, writer)

    async def close(self) -> None:
        await self.reader.close()
        await self.writer.close()

    async def _write(self, work: Callable[[PsycopgConnection], Awaitable[Any]]) -> Any:
        connection = self.writer  # autocommit: the transaction is the statements' own
        try:
            await connection.execute(BEGIN_WITH_LOCK_TIMEOUT.encode())
            result = await work(connection)
            await connection.execute(b"COMMIT")
        except BaseException:
            await connection.rollback()
            raise
        return result

    async def insert_start(self, start: RunStart, now: datetime) -> None:
        params = postgres_start_params(start, now)

        async def work(c: PsycopgConnection) -> None:
            await c.execute(POSTGRESQL["insert_start"], params)

        await self._write(work)

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        params = postgres_node_params(run_id, state, node, visit_id, self.clock())
        await self._write(lambda c: psycopg_update_node(c, params))

    async def get_run(self, run_id: str) -> Run:
        return await psycopg_get_run(self.reader, run_id)

    async def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        params = postgres_registration_params(registration, self.clock())

        async def work(c: PsycopgConnection) -> bool:
            found = await (await c.execute(POSTGRESQL["lock_current_visit"], params)).fetchone()
            if found is None:
                return False
            params["visit"] = visit = found[0]
            await c.execute(POSTGRESQL["insert_session_once"], params)
            cursor = await c.execute(POSTGRESQL["session_first_visit"], params)
            row = await cursor.fetchone()
            if row is None or row[0] != visit:
                return False
            cursor = await c.execute(POSTGRESQL["bind_session"], params)
            return bool(cursor.rowcount == 1)

        return bool(await self._write(work))


async def psycopg_get_run(connection: PsycopgConnection, run_id: str) -> Run:
    cursor = await connection.execute(POSTGRESQL["get_run"], {"run": run_id})
    row = await cursor.fetchone()
    if row is None:
        raise LookupError(run_id)
    return _postgres_row_to_run(row)


async def psycopg_update_node(connection: PsycopgConnection, params: dict[str, Any]) -> None:
    cursor = await connection.execute(POSTGRESQL["update_run_node"], params)
    if cursor.rowcount != 1:
        raise LookupError(params["run"])
    await connection.execute(POSTGRESQL["upsert_node_visit"], params)


# ------------------------------------------------------------- asyncpg ---


async def asyncpg_connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """A connection as the layer's engine makes it: statement cache off, UTC session."""
    kwargs.setdefault("statement_cache_size", 0)
    connection: asyncpg.Connection = await asyncpg.connect(dsn, **kwargs)
    await connection.execute(UTC_SESSION)
    return connection


def _args(name: str, params: dict[str, Any]) -> list[Any]:
    return [params[key] for key in ASYNCPG[name][1]]


def _affected(status: str) -> int:
    """The row count of a command status such as ``UPDATE 1``."""
    return int(status.rsplit(" ", 1)[-1])


async def asyncpg_execute(c: asyncpg.Connection, name: str, params: dict[str, Any]) -> str:
    status: str = await c.execute(ASYNCPG[name][0], *_args(name, params))
    return status


async def asyncpg_fetchrow(c: asyncpg.Connection, name: str, params: dict[str, Any]) -> Any:
    return await c.fetchrow(ASYNCPG[name][0], *_args(name, params))


async def asyncpg_get_run(connection: asyncpg.Connection, run_id: str) -> Run:
    row = await asyncpg_fetchrow(connection, "get_run", {"run": run_id})
    if row is None:
        raise LookupError(run_id)
    return _postgres_row_to_run(list(row))


async def asyncpg_update_node(connection: asyncpg.Connection, params: dict[str, Any]) -> None:
    async with connection.transaction():
        await connection.execute(SET_LOCK_TIMEOUT)
        if _affected(await asyncpg_execute(connection, "update_run_node", params)) != 1:
            raise LookupError(params["run"])
        await asyncpg_execute(connection, "upsert_node_visit", params)


class RawAsyncpg:
    """asyncpg: reads outside a transaction, writes in ``conn.transaction()``, on one connection."""

    driver = "asyncpg"

    def __init__(self, connection: asyncpg.Connection) -> None:
        self.clock: Callable[[], datetime] = _utc_now
        self.connection = connection

    @classmethod
    async def open(cls, dsn: str, **kwargs: Any) -> RawAsyncpg:
        return cls(await asyncpg_connect(dsn, **kwargs))

    async def close(self) -> None:
        await self.connection.close()

    async def insert_start(self, start: RunStart, now: datetime) -> None:
        c = self.connection
        async with c.transaction():
            await c.execute(SET_LOCK_TIMEOUT)
            await asyncpg_execute(c, "insert_start", postgres_start_params(start, now))

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        params = postgres_node_params(run_id, state, node, visit_id, self.clock())
        await asyncpg_update_node(self.connection, params)

    async def get_run(self, run_id: str) -> Run:
        return await asyncpg_get_run(self.connection, run_id)

    async def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        params = postgres_registration_params(registration, self.clock())
        c = self.connection
        async with c.transaction():
            await c.execute(SET_LOCK_TIMEOUT)
            found = await asyncpg_fetchrow(c, "lock_current_visit", params)
            if found is None:
                return False
            params["visit"] = visit = found[0]
            await asyncpg_execute(c, "insert_session_once", params)
            row = await asyncpg_fetchrow(c, "session_first_visit", params)
            if row is None or row[0] != visit:
                return False
            return _affected(await asyncpg_execute(c, "bind_session", params)) == 1


async def open_raw(driver: str, url: str, conninfo: str) -> RawAsyncDriver:
    if driver == "aiosqlite":
        return await RawAiosqlite.open(conninfo)
    if driver == "psycopg":
        return await RawPsycopgAsync.open(conninfo)
    return await RawAsyncpg.open(asyncpg_dsn(url))


# --------------------------------------------------------- a raw pool ---


class RawPool:
    """*size* connections in an ``asyncio.Queue``: the least a raw async service needs to
    share connections among many tasks (no reset on release, no health check)."""

    def __init__(self, connections: list[Any]) -> None:
        self.connections = connections
        self.idle: asyncio.Queue[Any] = asyncio.Queue()
        for connection in connections:
            self.idle.put_nowait(connection)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        connection = await self.idle.get()
        try:
            yield connection
        finally:
            self.idle.put_nowait(connection)

    async def close(self) -> None:
        for connection in self.connections:
            await connection.close()


class RawPoolWork:
    """``get_run`` and ``update_node`` on a :class:`RawPool` of psycopg or asyncpg connections.

    psycopg connections stay in autocommit; a write sends what the layer sends
    (``BEGIN; SET LOCAL lock_timeout``, the statements, ``COMMIT``).
    """

    def __init__(self, driver: str, pool: RawPool) -> None:
        self.driver = driver
        self.pool = pool

    @classmethod
    async def open(cls, driver: str, url: str, conninfo: str, size: int) -> RawPoolWork:
        if driver == "psycopg":
            connections: list[Any] = [await psycopg_connect(conninfo) for _ in range(size)]
        else:
            connections = [await asyncpg_connect(asyncpg_dsn(url)) for _ in range(size)]
        return cls(driver, RawPool(connections))

    async def get_run(self, run_id: str) -> Run:
        async with self.pool.connection() as connection:
            if self.driver == "psycopg":
                return await psycopg_get_run(connection, run_id)
            return await asyncpg_get_run(connection, run_id)

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        params = postgres_node_params(run_id, state, node, visit_id, _utc_now())
        async with self.pool.connection() as connection:
            if self.driver == "psycopg":
                await connection.execute(BEGIN_WITH_LOCK_TIMEOUT.encode())
                try:
                    await psycopg_update_node(connection, params)
                    await connection.execute(b"COMMIT")
                except BaseException:
                    await connection.rollback()
                    raise
            else:
                await asyncpg_update_node(connection, params)

    async def close(self) -> None:
        await self.pool.close()


# ------------------------------------------------------------- tracing ---


class _RecordingAsyncCursor(psycopg.AsyncCursor[Any]):
    trace: Trace
    recording: list[bool]

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if self.recording[0]:
            text = query.decode() if isinstance(query, bytes) else str(query)
            used = {name: params[name] for name in _PYFORMAT.findall(text)} if params else None
            self.trace.append((text, used))
        return await super().execute(query, params, **kwargs)


class _RecordedStatement:
    """An asyncpg prepared statement whose executions are recorded with their arguments."""

    def __init__(self, statement: Any, query: str, connection: _RecordingAsyncpg) -> None:
        self._statement = statement
        self._query = query
        self._connection = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._statement, name)

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        self._connection.record(self._query, args)
        return await self._statement.fetch(*args, **kwargs)


class _RecordingAsyncpg(asyncpg.Connection):  # type: ignore[misc]  # untyped base
    """asyncpg's documented ``connection_class`` hook: records every query it is given."""

    trace: Trace
    recording: list[bool]

    def record(self, query: str, args: Sequence[Any]) -> None:
        if self.recording[0]:
            self.trace.append((query, tuple(args)))

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        self.record(query, args)
        status: str = await super().execute(query, *args, timeout=timeout)
        return status

    async def fetchrow(
        self, query: str, *args: Any, timeout: float | None = None, record_class: Any = None
    ) -> Any:
        self.record(query, args)
        return await super().fetchrow(query, *args, timeout=timeout, record_class=record_class)

    async def prepare(
        self,
        query: str,
        *,
        name: str | None = None,
        timeout: float | None = None,
        record_class: Any = None,
    ) -> Any:
        statement = await super().prepare(
            query, name=name, timeout=timeout, record_class=record_class
        )
        return _RecordedStatement(statement, query, self)


def _normalized(trace: Trace) -> Trace:
    # asyncpg: BEGIN/COMMIT come with no arguments either way; () and None alike.
    return [(text, None if params == () else params) for text, params in trace]


async def verify_same_sql_async(
    driver: str,
    url: str,
    conninfo: str,
    layer_call: Callable[[AsyncRunProjection], Awaitable[object]],
    raw_call: Callable[[RawAsyncDriver], Awaitable[object]],
) -> Trace:
    """Fail loudly unless the async layer sends what the raw async baseline sends.

    Both run once with the same inputs and clock, traced at the driver: on
    aiosqlite SQLite's expanded SQL (BEGIN IMMEDIATE and COMMIT included); on
    psycopg each query's text and values (a recording cursor class); on asyncpg
    every query and its arguments, BEGIN and COMMIT included (a recording
    ``connection_class``). The layer runs on an engine of one connection,
    opened (and its dialect initialized) before tracing starts.
    """
    instant = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    layer_trace: Trace = []
    raw_trace: Trace = []
    recording = [False]
    connect_args: dict[str, Any] = {}
    if driver == "psycopg":
        layer_cursor = type(
            "LayerCursor", (_RecordingAsyncCursor,), {"trace": layer_trace, "recording": recording}
        )
        connect_args["cursor_factory"] = layer_cursor
    elif driver == "asyncpg":
        layer_class = type(
            "LayerConnection", (_RecordingAsyncpg,), {"trace": layer_trace, "recording": recording}
        )
        connect_args["connection_class"] = layer_class
    engine: AsyncEngine = create_async_engine(
        async_url(url, driver), pool_size=1, max_overflow=0, connect_args=connect_args
    )
    try:
        async with engine.connect() as connection:  # connect and initialize the dialect now
            native = (await connection.get_raw_connection()).driver_connection
            assert native is not None
        if driver == "aiosqlite":
            await native.set_trace_callback(lambda text: layer_trace.append((text, None)))
        recording[0] = True
        await layer_call(AsyncRunProjection(engine, clock=lambda: instant))
        recording[0] = False
        if driver == "aiosqlite":
            await native.set_trace_callback(None)
    finally:
        await engine.dispose()

    raw = await _traced_raw(driver, url, conninfo, raw_trace)
    raw.clock = lambda: instant
    try:
        await raw_call(raw)
    finally:
        await raw.close()
    if _normalized(layer_trace) != _normalized(raw_trace) or not layer_trace:
        raise AssertionError(
            f"the layer's SQL differs from the raw baseline's ({driver})\n"
            f"layer: {layer_trace!r}\nraw:   {raw_trace!r}"
        )
    return layer_trace


async def _traced_raw(driver: str, url: str, conninfo: str, trace: Trace) -> RawAsyncDriver:
    """A raw baseline whose driver connections record into *trace* (after their set-up)."""
    recording = [False]
    raw: RawAsyncDriver
    if driver == "aiosqlite":
        sqlite_raw = await RawAiosqlite.open(conninfo)
        await sqlite_raw.connection.set_trace_callback(lambda text: trace.append((text, None)))
        return sqlite_raw
    if driver == "psycopg":
        cursor = type(
            "RawCursor", (_RecordingAsyncCursor,), {"trace": trace, "recording": recording}
        )
        raw = await RawPsycopgAsync.open(conninfo, cursor_factory=cursor)
    else:
        connection_class = type(
            "RawConnection", (_RecordingAsyncpg,), {"trace": trace, "recording": recording}
        )
        raw = await RawAsyncpg.open(asyncpg_dsn(url), connection_class=connection_class)
    recording[0] = True
    return raw
