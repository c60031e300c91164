"""The connection the sync facade keeps between calls (held_connection.py).

Each test counts checkouts and connections with the pool's own events, so what
is measured is what the pool saw: reuse where it is allowed, and everything
back in the pool -- or closed -- where the pool's guarantees call for it.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fakes import FakeClock
from pool_counts import PoolCounts
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool, QueuePool

from relay_flow_projection import RunProjection, RunStart, RunState, create_engine
from relay_flow_projection.held_connection import HOLD_SECONDS

T0 = FakeClock().now
# Long enough for the reaper (it wakes every HOLD_SECONDS) to have run twice.
REAPED_WITHIN = 3 * HOLD_SECONDS


def _start(run_id: str) -> RunStart:
    return RunStart(id=run_id, repo="repo", workflow="wf", ticket_id="t", ticket_key=run_id)


def _checked_out(engine: Engine) -> int:
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    return pool.checkedout()


def _wait_for(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


@pytest.fixture
def held_engine(migrated_url: str) -> Iterator[Engine]:
    """An engine whose connections the sync facade keeps (SQLite, PostgreSQL)."""
    engine = create_engine(migrated_url)
    yield engine
    engine.dispose()


def _holding_both(engine: Engine) -> RunProjection:
    """A projection on *engine* that has just written and read run r1: it holds
    the writer's connection and the reader's."""
    projection = RunProjection(engine, clock=FakeClock())
    projection.insert_start(_start("r1"), T0)
    projection.get_run("r1")
    return projection


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_calls_in_a_row_share_one_checkout_per_role(held_engine: Engine) -> None:
    projection = _holding_both(held_engine)
    counts = PoolCounts(held_engine)
    for index in range(20):
        projection.update_node("r1", RunState.RUNNING, f"n{index}", "v")
        assert projection.get_run("r1").current_node == f"n{index}"
    # Both connections were held already (well within HOLD_SECONDS of their checkout,
    # unless this machine stalled for a second: then one more checkout per role).
    assert counts.checkouts <= 2
    projection.close()
    assert _checked_out(held_engine) == 0


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_a_connection_serves_calls_for_hold_seconds_then_goes_back(held_engine: Engine) -> None:
    projection = RunProjection(held_engine, clock=FakeClock())
    projection.insert_start(_start("r1"), T0)
    counts = PoolCounts(held_engine)
    started = time.monotonic()
    while time.monotonic() - started < 2.5 * HOLD_SECONDS:
        projection.get_run("r1")
    # Checked out again about once a HOLD_SECONDS: the pool's own checks still run.
    assert 2 <= counts.checkouts <= 4
    projection.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_an_idle_projection_holds_nothing_for_long(held_engine: Engine) -> None:
    projection = _holding_both(held_engine)
    assert _checked_out(held_engine) == 2  # the writer's and the reader's
    assert _wait_for(lambda: _checked_out(held_engine) == 0, REAPED_WITHIN)
    # The next call checks out again and works.
    assert projection.get_run("r1").state is RunState.STARTING


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_close_returns_what_the_projection_holds(held_engine: Engine) -> None:
    projection = _holding_both(held_engine)
    assert _checked_out(held_engine) == 2
    projection.close()
    assert _checked_out(held_engine) == 0
    # The caller's engine is untouched and usable.
    with held_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_a_dropped_projection_returns_what_it_holds(held_engine: Engine) -> None:
    projection = _holding_both(held_engine)
    assert _checked_out(held_engine) == 2
    del projection  # no close(): the executor's finalizer returns them
    gc.collect()
    assert _checked_out(held_engine) == 0


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_dispose_closes_the_held_connection_at_once(
    held_engine: Engine, dialect: str, migrated_url: str
) -> None:
    """The pool closes what is checked in; dispose() also closes what a slot holds
    (checked out), so nothing of the engine stays open: no session keeps ``DROP
    DATABASE`` out, and SQLite checkpoints and removes the WAL file."""
    projection = RunProjection(held_engine, clock=FakeClock())
    closed: list[object] = []
    sa.event.listen(held_engine, "close", lambda dbapi, _record: closed.append(dbapi))
    projection.insert_start(_start("r1"), T0)  # the writer's connection, held
    projection.get_run("r1")  # and the reader's
    assert _checked_out(held_engine) == 2
    held_engine.dispose()
    assert len(closed) == 2
    assert _checked_out(held_engine) == 0
    if dialect == "sqlite":
        assert not Path(f"{migrated_url}-wal").exists()
    counts = PoolCounts(held_engine)
    projection.update_node("r1", RunState.RUNNING, "n", "v")  # on the new pool
    assert counts.connects == 1
    projection.close()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_a_connection_is_kept_only_while_the_pool_has_one_to_spare(migrated_url: str) -> None:
    engine = create_engine(migrated_url, pool_size=2, max_overflow=2)
    try:
        projection = RunProjection(engine, clock=FakeClock())
        projection.insert_start(_start("r1"), T0)
        assert _checked_out(engine) == 1  # the writer's: one of two, one to spare
        projection.get_run("r1")  # keeping the reader's would leave none to spare
        assert _checked_out(engine) == 1
        projection.close()
    finally:
        engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_a_null_pool_is_used_as_configured(migrated_url: str) -> None:
    engine = create_engine(migrated_url, poolclass=NullPool)
    try:
        projection = RunProjection(engine, clock=FakeClock())
        projection.insert_start(_start("r1"), T0)
        counts = PoolCounts(engine)
        for _ in range(3):
            projection.get_run("r1")
        assert counts.connects == 3  # one connection per call, as NullPool promises
        projection.close()
    finally:
        engine.dispose()


@pytest.mark.parametrize("dialect", ["mysql"], indirect=True)
def test_mysql_connections_go_back_after_every_call(migrated_url: str) -> None:
    engine = create_engine(migrated_url)
    try:
        projection = RunProjection(engine, clock=FakeClock())
        projection.insert_start(_start("r1"), T0)
        projection.get_run("r1")
        assert _checked_out(engine) == 0
    finally:
        engine.dispose()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"], indirect=True)
def test_a_forked_child_leaves_the_parents_held_connection_alone(held_engine: Engine) -> None:
    projection = _holding_both(held_engine)
    assert _checked_out(held_engine) == 2
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            counts = PoolCounts(held_engine)
            projection.update_node("r1", RunState.RUNNING, "child", "v")
            assert projection.get_run("r1").current_node == "child"
            assert counts.connects == 2  # its own connections, not the parent's
            projection.close()  # must not touch the parent's connections
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's held connections still work (the child never touched them).
    counts = PoolCounts(held_engine)
    projection.update_node("r1", RunState.RUNNING, "parent", "v")
    assert projection.get_run("r1").current_node == "parent"
    assert counts.connects == 0
    projection.close()
