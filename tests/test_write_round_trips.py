"""A write on psycopg waits for the server once per statement it sends (issue 21).

Counted on the wire (benchmarks/turn_counter.py): every round trip of a write
is a statement the layer sent and the engine events saw -- ``BEGIN`` travels
with ``SET LOCAL lock_timeout`` in one simple query, the operation's own
statements follow, then ``COMMIT``. Before, psycopg sent its own ``BEGIN``
and ``COMMIT`` beside the layer's statements: two round trips more per write
than the cursor saw, one more than the statements need. Sync and asyncio
psycopg; asyncpg prepares each statement and keeps its own BEGIN
(dialect.folds_begin).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import load_benchmark_module
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url

from relay_flow_projection import (
    AsyncRunProjection,
    ExecutorIdentity,
    NodeSessionRegistration,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
    upgrade,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

# Each write, called with a fresh number k so that every call changes something.
WRITES: dict[str, Callable[[Any, int], Any]] = {
    "insert_start": lambda p, k: p.insert_start(RunStart(f"w-{k}", "repo", "wf", f"T-{k}", ""), T0),
    "update_state": lambda p, k: p.update_state("run", RunState.RUNNING, f"step {k}"),
    "update_node": lambda p, k: p.update_node("run", RunState.RUNNING, "build", f"v-{k}"),
    "register_node_session": lambda p, k: p.register_node_session(
        NodeSessionRegistration("run", "build", f"v-{k}")
    ),
    "record_processed_report": lambda p, k: p.record_processed_report("run", "v", f"r-{k}"),
    "initialize_identity": lambda p, k: p.initialize_identity(
        ExecutorIdentity("temporal", "temporal.internal:7233", "default")
    ),
}


class Statements:
    """The statements an engine's cursor events see."""

    def __init__(self, engine: Engine) -> None:
        self.seen: list[str] = []
        event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.seen.append(statement)


@pytest.fixture
def proxied_url(postgres_url: str) -> Iterator[tuple[str, Any]]:
    upgrade(postgres_url)
    url = make_url(postgres_url)
    turn_counter = load_benchmark_module("turn_counter")
    with turn_counter.TurnCounter(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield proxy.url(postgres_url), proxy


def _check(name: str, turns: int, statements: list[str]) -> None:
    assert statements[0].startswith("BEGIN; SET LOCAL lock_timeout = "), (name, statements)
    assert statements[-1] == "COMMIT", (name, statements)
    # Every wait for the server is one of the statements above: nothing unseen.
    assert turns == len(statements), (name, turns, statements)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_sync_psycopg_write_waits_once_per_statement(
    proxied_url: tuple[str, Any], name: str
) -> None:
    url, proxy = proxied_url
    projection = RunProjection(create_engine(url))
    try:
        projection.insert_start(RunStart("run", "repo", "wf", "T-run", ""), T0)
        WRITES[name](projection, 0)  # warm: connected, compiled, first-call rows in place
        statements = Statements(projection.engine)
        before = proxy.count()
        WRITES[name](projection, 1)
        _check(name, proxy.count() - before, statements.seen)
    finally:
        projection.close()
        projection.engine.dispose()


@pytest.mark.parametrize("name", sorted(WRITES))
def test_async_psycopg_write_waits_once_per_statement(
    proxied_url: tuple[str, Any], name: str
) -> None:
    url, proxy = proxied_url

    async def measure() -> tuple[int, list[str]]:
        engine = create_async_engine(url)
        projection = AsyncRunProjection(engine)
        try:
            await projection.insert_start(RunStart("run", "repo", "wf", "T-run", ""), T0)
            await WRITES[name](projection, 0)
            statements = Statements(engine.sync_engine)
            before = proxy.count()
            await WRITES[name](projection, 1)
            return proxy.count() - before, statements.seen
        finally:
            await engine.dispose()

    turns, seen = asyncio.run(measure())
    _check(name, turns, seen)
