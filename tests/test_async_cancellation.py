"""Cancelling an AsyncRunProjection call at any point leaves nothing behind.

Hundreds of calls are cancelled at random moments -- by ``asyncio.wait_for``
timeouts and by ``Task.cancel()`` -- on aiosqlite, psycopg's asyncio mode and
asyncpg. Afterwards every run's current visit equals its node runtime's visit
(``update_node`` is never half-applied), no connection stays checked out once
what the projection holds between calls has expired, the SQLite write lock is
free, and PostgreSQL has no session left in a transaction.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import async_target
from fakes import FakeClock

from relay_flow_projection import (
    AsyncRunProjection,
    NodeSessionRegistration,
    RunStart,
    create_async_engine,
)
from relay_flow_projection.held_connection import HOLD_SECONDS

RUNS = 8
# Calls go on, 8 at a time, until this many were cancelled (at most MAX_CALLS).
CANCELLATIONS = 200
MAX_CALLS = 2000


def _start(run_id: str) -> RunStart:
    return RunStart(
        id=run_id,
        logical_id="",
        attempt_id=1,
        repo="repo",
        workflow="wf",
        ticket_id="t",
        ticket_key=f"T-{run_id}",
    )


async def _call_duration(projection: AsyncRunProjection) -> float:
    """The median time of one update_node here and now: cancellation delays are
    drawn in multiples of it, so they fall inside calls on a fast machine and a
    slow one alike."""
    durations = []
    for index in range(15):
        started = time.perf_counter()
        await projection.update_node("r0", "running", "n0", f"v-calibrate-{index}")
        durations.append(time.perf_counter() - started)
    return sorted(durations)[len(durations) // 2]


async def _cancel_storm(projection: AsyncRunProjection, seed: int, unit: float) -> tuple[int, int]:
    """Calls until CANCELLATIONS were cancelled somewhere in them; (cancelled, completed)."""
    rng = random.Random(seed)
    cancelled = completed = 0

    async def one(index: int) -> None:
        run_id = f"r{index % RUNS}"
        node = f"n{rng.randrange(4)}"
        if index % 3 == 2:
            await projection.register_node_session(
                NodeSessionRegistration(run_id, node, f"s{index}")
            )
        else:
            await projection.update_node(run_id, "running", node, f"v{index}")

    for batch in range(MAX_CALLS // 8):
        if cancelled >= CANCELLATIONS:
            break
        tasks = [asyncio.create_task(one(batch * 8 + slot)) for slot in range(8)]
        # Cancel some tasks directly after a random delay, time out the rest.
        await asyncio.sleep(rng.random() * 4 * unit)
        for task in tasks[: rng.randrange(0, 5)]:
            task.cancel()
        for task in tasks:
            try:
                await asyncio.wait_for(task, timeout=rng.random() * 6 * unit)
                completed += 1
            except (asyncio.CancelledError, TimeoutError):
                cancelled += 1
    return cancelled, completed


@pytest.mark.parametrize("facade", ["async", "asyncpg"], indirect=True)
def test_random_cancellations_leave_no_partial_write_or_held_resource(
    migrated_url: str, facade: str, dialect: str
) -> None:
    target, kwargs = async_target(migrated_url, facade)
    application = f"relay_cancel_{uuid.uuid4().hex[:12]}"
    if dialect == "postgresql":
        connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", None) or {})
        if facade == "asyncpg":
            settings = dict(connect_args.get("server_settings", {}))
            settings["application_name"] = application
            connect_args["server_settings"] = settings
        else:
            connect_args["application_name"] = application
        kwargs["connect_args"] = connect_args

    async def scenario() -> dict[str, Any]:
        engine = create_async_engine(target, lock_timeout=5, **kwargs)
        projection = AsyncRunProjection(engine, clock=FakeClock())
        try:
            for index in range(RUNS):
                await projection.insert_start(_start(f"r{index}"), FakeClock().now)
                await projection.update_node(f"r{index}", "running", "n0", "v-initial")
            unit = await _call_duration(projection)
            cancelled, completed = await _cancel_storm(projection, len(target), unit)
            # Cancelled cleanups (rollback, check-in) finish, and the connections
            # the projection keeps between calls expire and go back.
            await asyncio.sleep(HOLD_SECONDS + 0.2)
            pool: Any = engine.sync_engine.pool
            checked_out = pool.checkedout()
            # The write lock is free and the database answers a write at once.
            started = time.monotonic()
            await projection.update_node("r0", "running", "n-final", "v-final")
            write_after = time.monotonic() - started
            mismatched = []
            for index in range(RUNS):
                run = await projection.get_run(f"r{index}")
                assert run.current_node is not None
                runtime = await projection.get_node_runtime(run.id, run.current_node)
                if runtime.node_visit_id != run.current_node_visit_id:
                    mismatched.append((run.id, run.current_node_visit_id, runtime.node_visit_id))
            return {
                "cancelled": cancelled,
                "completed": completed,
                "checked_out": checked_out,
                "write_after": write_after,
                "mismatched": mismatched,
            }
        finally:
            await engine.dispose()

    result = asyncio.run(scenario())
    assert result["cancelled"] >= CANCELLATIONS, result
    assert result["mismatched"] == []
    assert result["checked_out"] == 0
    assert result["write_after"] < 2.0, result
    if dialect == "postgresql":
        admin = sa.create_engine(
            sa.make_url(migrated_url).set(drivername="postgresql+psycopg"),
            poolclass=sa.pool.NullPool,
        )
        with admin.connect() as connection:
            open_transactions = connection.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = :name AND state LIKE 'idle in transaction%'"
                ),
                {"name": application},
            ).scalar_one()
        admin.dispose()
        assert open_transactions == 0
