"""The connections the asyncio facade keeps between calls (held_connection.LoopHeldConnection).

As in test_held_connection.py, what is counted is what the pool saw (its
``checkout``, ``connect`` and ``close`` events and ``checkedout()``): reuse
within ``HOLD_SECONDS``, and everything back in the pool once it expires, once
``asyncio.run()`` ends, at ``close()`` and at ``dispose()`` -- which only a
task on the connection's own event loop can do for an async driver.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from async_adapter import LoopThread
from conftest import async_target
from fakes import FakeClock
from pool_counts import PoolCounts
from sqlalchemy.ext.asyncio import AsyncEngine

from relay_flow_projection import AsyncRunProjection, RunStart, RunState, create_async_engine
from relay_flow_projection.held_connection import HOLD_SECONDS

T0 = FakeClock().now
ON_EVERY_DRIVER = [
    pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True),
    pytest.mark.parametrize("facade", ["async", "asyncpg"], indirect=True),
]


def _start(run_id: str) -> RunStart:
    return RunStart(id=run_id, repo="repo", workflow="wf", ticket_id="t", ticket_key=run_id)


def _engine(migrated_url: str, facade: str, **arguments: Any) -> AsyncEngine:
    target, kwargs = async_target(migrated_url, facade)
    return create_async_engine(target, **kwargs, **arguments)


def _checked_out(engine: AsyncEngine) -> int:
    pool: Any = engine.sync_engine.pool
    return int(pool.checkedout())


async def _holding_both(engine: AsyncEngine) -> AsyncRunProjection:
    """A projection that has just written and read run r1: it holds the writer's
    connection and the reader's."""
    projection = AsyncRunProjection(engine, clock=FakeClock())
    await projection.insert_start(_start("r1"), T0)
    await projection.get_run("r1")
    return projection


@ON_EVERY_DRIVER[0]
@ON_EVERY_DRIVER[1]
def test_calls_in_a_row_share_one_checkout_per_role(migrated_url: str, facade: str) -> None:
    engine = _engine(migrated_url, facade)

    async def scenario() -> tuple[int, int, int]:
        try:
            projection = await _holding_both(engine)
            counts = PoolCounts(engine.sync_engine)
            for index in range(20):
                await projection.update_node("r1", RunState.RUNNING, f"n{index}", "v")
                assert (await projection.get_run("r1")).current_node == f"n{index}"
            holding = _checked_out(engine)
            await projection.close()
            return counts.checkouts, holding, _checked_out(engine)
        finally:
            await engine.dispose()

    checkouts, holding, after_close = asyncio.run(scenario())
    # Both were held already (unless this machine stalled for HOLD_SECONDS: one
    # more checkout per role then).
    assert checkouts <= 2
    assert holding == 2  # the writer's and the reader's
    assert after_close == 0


@ON_EVERY_DRIVER[0]
@ON_EVERY_DRIVER[1]
def test_held_connections_go_back_when_they_expire(migrated_url: str, facade: str) -> None:
    engine = _engine(migrated_url, facade)

    async def scenario() -> tuple[int, int, RunState]:
        try:
            projection = await _holding_both(engine)
            holding = _checked_out(engine)
            # The keeper returns each once HOLD_SECONDS have passed since its checkout.
            await asyncio.sleep(HOLD_SECONDS + 0.3)
            expired = _checked_out(engine)
            state = (await projection.get_run("r1")).state  # checks out again, and works
            await projection.close()
            return holding, expired, state
        finally:
            await engine.dispose()

    holding, expired, state = asyncio.run(scenario())
    assert (holding, expired) == (2, 0)
    assert state is RunState.STARTING


@ON_EVERY_DRIVER[0]
@ON_EVERY_DRIVER[1]
def test_the_end_of_asyncio_run_returns_what_is_held(
    migrated_url: str, facade: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No close(), no dispose(): asyncio.run() cancels the keepers before it closes
    the loop, and they return the connections on it -- nothing is left for the
    garbage collector to drop unclosed, and no task is destroyed pending."""
    engine = _engine(migrated_url, facade)

    async def scenario() -> int:
        await _holding_both(engine)
        return _checked_out(engine)

    caplog.set_level(logging.ERROR, logger="asyncio")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        holding = asyncio.run(scenario())
        after = _checked_out(engine)
        gc.collect()
    assert (holding, after) == (2, 0)
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in caplog.records] == []

    async def dispose() -> None:
        await engine.dispose()

    asyncio.run(dispose())


@ON_EVERY_DRIVER[0]
@ON_EVERY_DRIVER[1]
def test_dispose_closes_held_connections_at_once(
    migrated_url: str, facade: str, dialect: str
) -> None:
    """As for the sync facade: nothing of the engine stays open after dispose()."""
    engine = _engine(migrated_url, facade)

    async def scenario() -> tuple[int, int, int, int]:
        projection = await _holding_both(engine)
        counts = PoolCounts(engine.sync_engine)
        holding = _checked_out(engine)
        await engine.dispose()
        closed, after = counts.closes, _checked_out(engine)
        await projection.update_node("r1", RunState.RUNNING, "n", "v")  # on the new pool
        connects = counts.connects
        await projection.close()
        await engine.dispose()
        return holding, closed, after, connects

    holding, closed, after, connects = asyncio.run(scenario())
    assert (holding, closed, after, connects) == (2, 2, 0, 1)
    if dialect == "sqlite":
        assert not Path(f"{migrated_url}-wal").exists()


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_another_loop_neither_uses_nor_ends_them(migrated_url: str) -> None:
    """A projection used from a second event loop checks out its own connection there;
    close() from it leaves the first loop's to that loop's keeper, which ends them.
    (aiosqlite: its connections may move between loops, so the pool can serve both.)"""
    engine = create_async_engine(migrated_url)
    first = LoopThread()
    try:
        projection = first.call(_holding_both(engine))
        counts = PoolCounts(engine.sync_engine)

        async def elsewhere() -> RunState:
            state = (await projection.get_run("r1")).state
            await projection.close()  # the first loop's keeper returns its connections
            return state

        assert asyncio.run(elsewhere()) is RunState.STARTING
        assert counts.checkouts == 1  # its own, not the first loop's held reader
        deadline = time.monotonic() + 3 * HOLD_SECONDS
        while _checked_out(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _checked_out(engine) == 0
    finally:
        first.call(engine.dispose())
        first.stop()


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_a_loop_closed_without_ending_its_tasks_leaves_no_stuck_slot(migrated_url: str) -> None:
    """A loop closed by hand with its keepers still pending orphans what they kept:
    nothing can close it any more. The next loop's calls drop it and hold their own,
    rather than checking out per call for good."""
    engine = create_async_engine(migrated_url)
    loop = asyncio.new_event_loop()
    projection = loop.run_until_complete(_holding_both(engine))

    async def later() -> int:
        counts = PoolCounts(engine.sync_engine)
        for _ in range(3):
            await projection.get_run("r1")
        checkouts = counts.checkouts
        await projection.close()
        await engine.dispose()
        return checkouts

    with warnings.catch_warnings():
        # The orphans' clean-up by the garbage collector says so; that is expected here.
        warnings.simplefilter("ignore")
        loop.close()
        checkouts = asyncio.run(later())
        del loop
        gc.collect()
    assert checkouts == 1  # the new loop's reader, held for the next two calls
