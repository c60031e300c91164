"""A write whose COMMIT answer is lost is never run again blindly (API.md, *Ambiguous commits*).

Each call runs through a proxy (tests/commit_dropping_proxy.py) that drops the
connection at the write's COMMIT: after forwarding it (the server commits,
the client never hears it) or instead of forwarding it (nothing commits).
Either way the client cannot know, so the call raises ``DatabaseUnavailable``
saying the outcome is unknown -- except the sweep, which finds out whether
its batch's runs still exist and answers as the attempt that committed would
have. Before, every such call was retried once on a new connection: the
retry could put back a state another caller had written in between, answer
False for a session the lost attempt had bound, and the sweep returned []
for a batch it had deleted.

A connection found dead *before* COMMIT (what a server restart leaves) is
still retried once: tests/test_server_restart.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from async_adapter import BlockingAsyncProjection, LoopThread
from commit_dropping_proxy import CommitDroppingProxy
from conftest import archived, async_target
from fakes import FakeClock
from sqlalchemy.engine import make_url

from relay_flow_projection import (
    AsyncRunProjection,
    DatabaseUnavailable,
    ExecutorIdentity,
    NodeSessionRegistration,
    RunNotFound,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["postgresql", "mysql"])
def dialect(request: pytest.FixtureRequest) -> str:
    """The servers a connection can be lost to (SQLite has no connection to lose)."""
    return str(request.param)


@dataclass
class Setup:
    proxied: RunProjection  # the facade under test, through the proxy
    direct: RunProjection  # another caller, and the test's eyes
    proxy: CommitDroppingProxy


@pytest.fixture
def setup(
    migrated_url: str, facade: str, clock: FakeClock, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    url = make_url(migrated_url)
    proxy = CommitDroppingProxy(url.host or "127.0.0.1", url.port or 0)
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    direct_engine = create_engine(migrated_url)
    direct = RunProjection(direct_engine, clock=clock)
    if facade == "sync":
        engine = create_engine(through)
        yield Setup(RunProjection(engine, clock=clock), direct, proxy)
        engine.dispose()
    else:
        loop: LoopThread = request.getfixturevalue("loop_thread")
        target, kwargs = async_target(through, facade)
        async_engine = create_async_engine(target, **kwargs)
        adapter = BlockingAsyncProjection(
            AsyncRunProjection(async_engine, clock=clock), loop, direct_engine
        )
        yield Setup(cast(RunProjection, adapter), direct, proxy)
        loop.call(async_engine.dispose())
    proxy.close()
    direct_engine.dispose()


def start(run_id: str) -> RunStart:
    return RunStart(id=run_id, repo="repo", workflow="wf", ticket_id="t", ticket_key=run_id)


def started(projection: RunProjection, run_id: str) -> None:
    projection.insert_start(start(run_id), T0)
    projection.update_node(run_id, RunState.RUNNING, "build", "v1")


def warm(projection: RunProjection, run_id: str) -> None:
    """Connections through the proxy, warm, for reads and for writes (the sync facade
    keeps one of each between calls: held_connection.py), so that the armed proxy
    meets the call's own COMMIT, not a new connection's session set-up. The write
    changes nothing the tests look at (no retry status was set)."""
    projection.get_run(run_id)
    projection.update_retry(run_id, None)


def assert_unknown(call: Callable[[], object], proxy: CommitDroppingProxy) -> None:
    with pytest.raises(DatabaseUnavailable, match="whether the write committed is unknown"):
        call()
    assert proxy.dropped.is_set(), "the proxy never saw the write's COMMIT"


# Each write, and what the database holds once it committed (a read through `direct`).
WRITES: dict[str, tuple[Callable[[RunProjection], object], Callable[[RunProjection], bool]]] = {
    "insert_start": (
        lambda p: p.insert_start(start("w2"), T0),
        lambda d: _exists(d, "w2"),
    ),
    "update_node": (
        lambda p: p.update_node("w1", RunState.RUNNING, "test", "v2"),
        lambda d: d.get_run("w1").current_node == "test",
    ),
    "update_state": (
        lambda p: p.update_state("w1", RunState.BLOCKED, "why"),
        lambda d: d.get_run("w1").state == RunState.BLOCKED,
    ),
    "register_node_session": (
        lambda p: p.register_node_session(NodeSessionRegistration("w1", "build", "s1")),
        lambda d: d.get_node_runtime("w1", "build").session_id == "s1",
    ),
    "record_processed_report": (
        lambda p: p.record_processed_report("w1", "v1", "report-1"),
        lambda d: d.has_processed_report("w1", "report-1"),
    ),
    "initialize_identity": (
        lambda p: p.initialize_identity(ExecutorIdentity("goworkflows")),
        lambda d: d.identity() == ExecutorIdentity("goworkflows"),
    ),
}


def _exists(projection: RunProjection, run_id: str) -> bool:
    try:
        projection.get_run(run_id)
    except RunNotFound:
        return False
    return True


@pytest.mark.parametrize("forward", [True, False], ids=["committed", "rolled-back"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_lost_commit_is_reported_as_unknown_not_run_again(
    setup: Setup, write: str, forward: bool
) -> None:
    call, committed = WRITES[write]
    started(setup.direct, "w1")
    warm(setup.proxied, "w1")
    setup.proxy.arm(forward=forward)
    assert_unknown(lambda: call(setup.proxied), setup.proxy)
    # Not run again: a retry would have committed what the lost COMMIT did not.
    assert committed(setup.direct) is forward
    # The next call works, on a new connection, and (idempotent) completes the write.
    call(setup.proxied)
    assert committed(setup.direct)


def test_a_retry_does_not_overwrite_what_another_caller_wrote_meanwhile(setup: Setup) -> None:
    started(setup.direct, "u1")
    warm(setup.proxied, "u1")

    def newer_write() -> None:
        setup.direct.update_state("u1", RunState.BLOCKED, "newer")

    setup.proxy.arm(newer_write)
    assert_unknown(lambda: setup.proxied.update_state("u1", RunState.RUNNING), setup.proxy)
    run = setup.direct.get_run("u1")
    assert (run.state, run.last_error) == (RunState.BLOCKED, "newer")


def test_a_session_bound_by_the_lost_attempt_is_not_answered_false(setup: Setup) -> None:
    started(setup.direct, "s1")
    warm(setup.proxied, "s1")

    def visit_moves_on() -> None:
        setup.direct.update_node("s1", RunState.RUNNING, "build", "v2")

    setup.proxy.arm(visit_moves_on)
    registration = NodeSessionRegistration("s1", "build", "session-a")
    assert_unknown(lambda: setup.proxied.register_node_session(registration), setup.proxy)
    assert setup.direct.get_node_runtime("s1", "build").session_id == "session-a"


@pytest.mark.parametrize("forward", [True, False], ids=["committed", "rolled-back"])
def test_the_sweep_settles_a_lost_commit_and_returns_every_id_it_deleted(
    setup: Setup, forward: bool, tmp_path: Path
) -> None:
    ids = [f"old-{i}" for i in range(5)]
    for run_id in ids:
        setup.direct.insert_start(start(run_id), T0)
        setup.direct.update_state(run_id, RunState.COMPLETED, finished_at=T0)
    setup.direct.insert_start(start("young"), T0)
    warm(setup.proxied, "young")
    archive = tmp_path / "archive.jsonl"
    setup.proxy.arm(forward=forward)
    swept = setup.proxied.sweep_retention(T0 + timedelta(days=1), archive=archive)
    assert setup.proxy.dropped.is_set(), "the proxy never saw the sweep's COMMIT"
    assert sorted(swept) == ids
    assert setup.direct.count_sweepable(T0 + timedelta(days=1)) == 0
    assert _exists(setup.direct, "young")
    # Every swept run is in the archive (twice when the batch ran again).
    assert {record["run"]["id"] for record in archived(archive)} == set(ids)
