"""Run rows: insert_start, update_state, update_retry, update_node and the single-run reads.

Every test runs on SQLite and PostgreSQL (the ``projection`` fixture is
parametrized over both). Expected behaviour follows API.md, and the Go
reference (``projection.go``) where the contract is silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from fakes import FakeClock
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeRuntime,
    ProjectionError,
    RetryStatus,
    Run,
    RunNotFound,
    RunProjection,
    RunStart,
    RunState,
)
from relay_flow_projection.schema import runs

Rows = Callable[[str], list[tuple[object, ...]]]

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)
NON_TERMINAL = [s for s in RunState if not s.is_terminal]
TERMINAL = [s for s in RunState if s.is_terminal]


def start(
    run_id: str = "r1",
    *,
    repo: str = "acme/api",
    workflow: str = "deploy",
    ticket_id: str = "T-1",
    ticket_key: str = "ACME-1",
    logical_id: str = "",
    attempt_id: int = 0,
) -> RunStart:
    return RunStart(
        id=run_id,
        repo=repo,
        workflow=workflow,
        ticket_id=ticket_id,
        ticket_key=ticket_key,
        logical_id=logical_id,
        attempt_id=attempt_id,
    )


def raw_run(engine: Engine, run_id: str) -> sa.Row[tuple[object, ...]]:
    """The stored row itself, to see NULL where the API would show None anyway."""
    with engine.connect() as connection:
        return connection.execute(sa.select(runs).where(runs.c.id == run_id)).one()


@pytest.fixture
def started(projection: RunProjection) -> RunProjection:
    projection.insert_start(start(), T0)
    return projection


# ------------------------------------------------------------ insert_start ---


def test_insert_start_records_a_starting_run(projection: RunProjection) -> None:
    projection.insert_start(start(logical_id="logical-1", attempt_id=3), T0)

    assert projection.get_run("r1") == Run(
        id="r1",
        logical_id="logical-1",
        attempt_id=3,
        repo="acme/api",
        workflow="deploy",
        ticket_id="T-1",
        ticket_key="ACME-1",
        state=RunState.STARTING,
        current_node=None,
        current_node_visit_id=None,
        last_error=None,
        retry=None,
        started_at=T0,
        updated_at=T0,
        finished_at=None,
    )


def test_insert_start_uses_now_argument_not_the_clock(
    projection: RunProjection, clock: FakeClock
) -> None:
    projection.insert_start(start(), T0)

    run = projection.get_run("r1")
    assert run.started_at == run.updated_at == T0
    assert run.started_at != clock()


def test_insert_start_defaults_logical_id_and_attempt(
    projection: RunProjection, engine: Engine
) -> None:
    projection.insert_start(start(), T0)

    run = projection.get_run("r1")
    assert run.logical_id == "r1"
    assert run.attempt_id == 1
    # The defaults are stored, not only substituted on read.
    row = raw_run(engine, "r1")
    assert (row.logical_run_id, row.attempt_id) == ("r1", 1)


def test_insert_start_state_is_starting_and_string_equal(projection: RunProjection) -> None:
    projection.insert_start(start(), T0)

    state = projection.get_run("r1").state
    assert state is RunState.STARTING
    assert str(state) == "starting"
    assert not state.is_terminal


def test_insert_start_twice_with_other_fields_changes_nothing(
    projection: RunProjection, table_rows: Rows
) -> None:
    projection.insert_start(start(logical_id="L", attempt_id=2), T0)
    before = table_rows("relay_runs")

    projection.insert_start(
        start(
            repo="other/repo",
            workflow="other",
            ticket_id="T-9",
            ticket_key="OTHER-9",
            logical_id="L2",
            attempt_id=7,
        ),
        T0 + timedelta(hours=1),
    )

    assert table_rows("relay_runs") == before


def test_insert_start_replayed_after_progress_does_not_reset_the_run(
    projection: RunProjection, clock: FakeClock, table_rows: Rows
) -> None:
    projection.insert_start(start(), T0)
    clock.advance(seconds=5)
    projection.update_node("r1", RunState.RUNNING, "build", "v1")
    projection.update_state("r1", RunState.COMPLETED, finished_at=clock())
    before = table_rows("relay_runs")

    projection.insert_start(start(), T0)  # a replayed activity after a crash

    assert table_rows("relay_runs") == before
    assert projection.get_run("r1").state is RunState.COMPLETED


def test_insert_start_keeps_distinct_runs_apart(projection: RunProjection) -> None:
    projection.insert_start(start("r1", ticket_key="A-1"), T0)
    projection.insert_start(start("r2", ticket_key="A-2"), T0 + timedelta(seconds=1))

    assert projection.get_run("r1").ticket_key == "A-1"
    assert projection.get_run("r2").ticket_key == "A-2"
    assert projection.get_run("r2").started_at == T0 + timedelta(seconds=1)


def test_insert_start_accepts_empty_ticket_fields(projection: RunProjection) -> None:
    projection.insert_start(start(repo="", workflow="", ticket_id="", ticket_key=""), T0)

    run = projection.get_run("r1")
    assert (run.repo, run.workflow, run.ticket_id, run.ticket_key) == ("", "", "", "")


# ------------------------------------------------------------ update_state ---


def test_update_state_sets_state_error_and_updated_at(
    started: RunProjection, clock: FakeClock
) -> None:
    now = clock.advance(seconds=30)

    started.update_state("r1", RunState.BLOCKED, "waiting for approval")

    run = started.get_run("r1")
    assert run.state is RunState.BLOCKED
    assert run.last_error == "waiting for approval"
    assert run.updated_at == now
    assert run.started_at == T0
    assert run.finished_at is None


@pytest.mark.parametrize("state", list(RunState))
def test_update_state_accepts_enum_and_string(started: RunProjection, state: RunState) -> None:
    started.update_state("r1", state)
    assert started.get_run("r1").state is state

    started.update_state("r1", RunState.STARTING)
    started.update_state("r1", state.value)
    assert started.get_run("r1").state is state


@pytest.mark.parametrize("empty", [None, ""])
def test_update_state_empty_error_is_stored_as_null(
    started: RunProjection, engine: Engine, empty: str | None
) -> None:
    started.update_state("r1", RunState.RUNNING, "first failure")
    assert started.get_run("r1").last_error == "first failure"

    started.update_state("r1", RunState.RUNNING, empty)

    assert started.get_run("r1").last_error is None
    assert raw_run(engine, "r1").last_error is None


def test_update_state_overwrites_previous_error(started: RunProjection) -> None:
    started.update_state("r1", RunState.RUNNING, "first")
    started.update_state("r1", RunState.RUNNING, "second")
    assert started.get_run("r1").last_error == "second"


def test_update_state_sets_finished_at_only_when_given(
    started: RunProjection, clock: FakeClock
) -> None:
    finished = T0 + timedelta(minutes=10, microseconds=7)
    started.update_state("r1", RunState.COMPLETED, finished_at=finished)
    assert started.get_run("r1").finished_at == finished

    clock.advance(minutes=20)
    started.update_state("r1", RunState.CANCELED, "late cancel")  # no finished_at given
    run = started.get_run("r1")
    assert run.finished_at == finished
    assert run.state is RunState.CANCELED

    started.update_state("r1", RunState.RUNNING)  # not even a non-terminal state clears it
    assert started.get_run("r1").finished_at == finished


def test_update_state_given_finished_at_replaces_the_old_one(started: RunProjection) -> None:
    started.update_state("r1", RunState.COMPLETED, finished_at=T0 + timedelta(minutes=1))
    started.update_state("r1", RunState.COMPLETED, finished_at=T0 + timedelta(minutes=2))
    assert started.get_run("r1").finished_at == T0 + timedelta(minutes=2)


def test_update_state_never_sets_finished_at_by_itself(started: RunProjection) -> None:
    started.update_state("r1", RunState.COMPLETED)
    assert started.get_run("r1").finished_at is None


def test_update_state_finished_at_on_non_terminal_state_is_stored(
    started: RunProjection,
) -> None:
    # The Go code stores whatever it is given; the state decides nothing here.
    started.update_state("r1", RunState.CANCELING, finished_at=T0 + timedelta(hours=1))
    assert started.get_run("r1").finished_at == T0 + timedelta(hours=1)


@pytest.mark.parametrize("state", TERMINAL)
def test_terminal_state_clears_retry_status(
    started: RunProjection, engine: Engine, state: RunState
) -> None:
    started.update_retry("r1", RetryStatus(2, "flaky", T0 + timedelta(minutes=5)))
    assert started.get_run("r1").retry is not None

    started.update_state("r1", state.value, finished_at=T0 + timedelta(minutes=1))

    assert started.get_run("r1").retry is None
    row = raw_run(engine, "r1")
    assert (row.retry_error, row.retry_attempt, row.next_retry_at) == (None, None, None)


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_non_terminal_state_keeps_retry_status(started: RunProjection, state: RunState) -> None:
    status = RetryStatus(2, "flaky", T0 + timedelta(minutes=5))
    started.update_retry("r1", status)

    started.update_state("r1", state, "still failing")

    run = started.get_run("r1")
    assert run.retry == status
    assert run.last_error == "still failing"


@pytest.mark.parametrize("bad", ["bogus", "Completed", "", "done"])
def test_update_state_unknown_state_raises_and_changes_nothing(
    started: RunProjection, table_rows: Rows, bad: str
) -> None:
    before = table_rows("relay_runs")
    with pytest.raises(ValueError, match="state"):
        started.update_state("r1", bad, "error")
    assert table_rows("relay_runs") == before


def test_update_state_unknown_run_raises_and_changes_nothing(
    started: RunProjection, table_rows: Rows
) -> None:
    before = table_rows("relay_runs")
    with pytest.raises(RunNotFound, match="missing-run"):
        started.update_state("missing-run", RunState.COMPLETED, "x", T0)
    assert table_rows("relay_runs") == before


def test_update_state_touches_only_its_run(started: RunProjection, clock: FakeClock) -> None:
    started.insert_start(start("r2"), T0)
    before = started.get_run("r2")
    clock.advance(seconds=1)

    started.update_state("r1", RunState.CANCELED, "stop", clock())

    assert started.get_run("r2") == before


# ------------------------------------------------------------ update_retry ---


def test_update_retry_sets_status_and_updated_at(started: RunProjection, clock: FakeClock) -> None:
    now = clock.advance(seconds=3)
    status = RetryStatus(attempt=4, last_error="connection reset", next_retry_at=T0 + timedelta(1))

    started.update_retry("r1", status)

    run = started.get_run("r1")
    assert run.retry == status
    assert run.updated_at == now
    assert run.state is RunState.STARTING
    assert run.last_error is None  # the retry error is not the run's last_error


def test_update_retry_overwrites_previous_status(started: RunProjection) -> None:
    started.update_retry("r1", RetryStatus(1, "a", T0 + timedelta(minutes=1)))
    started.update_retry("r1", RetryStatus(2, "b", T0 + timedelta(minutes=2)))
    assert started.get_run("r1").retry == RetryStatus(2, "b", T0 + timedelta(minutes=2))


def test_update_retry_none_clears_status(
    started: RunProjection, engine: Engine, clock: FakeClock
) -> None:
    started.update_retry("r1", RetryStatus(1, "a", T0 + timedelta(minutes=1)))
    now = clock.advance(seconds=9)

    started.update_retry("r1", None)

    run = started.get_run("r1")
    assert run.retry is None
    assert run.updated_at == now
    row = raw_run(engine, "r1")
    assert (row.retry_error, row.retry_attempt, row.next_retry_at) == (None, None, None)


def test_update_retry_attempt_zero_is_a_set_status(started: RunProjection) -> None:
    started.update_retry("r1", RetryStatus(0, "first", T0))
    assert started.get_run("r1").retry == RetryStatus(0, "first", T0)


@pytest.mark.parametrize("missing", ["retry_error", "retry_attempt", "next_retry_at"])
def test_retry_present_only_when_all_three_columns_are_set(
    started: RunProjection, engine: Engine, missing: str
) -> None:
    started.update_retry("r1", RetryStatus(3, "boom", T0))
    with engine.begin() as connection:
        connection.execute(sa.update(runs).where(runs.c.id == "r1").values({missing: None}))

    assert started.get_run("r1").retry is None


def test_update_retry_unknown_run_raises_and_changes_nothing(
    started: RunProjection, table_rows: Rows
) -> None:
    before = table_rows("relay_runs")
    with pytest.raises(RunNotFound, match="nope"):
        started.update_retry("nope", RetryStatus(1, "x", T0))
    with pytest.raises(RunNotFound, match="nope"):
        started.update_retry("nope", None)
    assert table_rows("relay_runs") == before


# ------------------------------------------------------------- update_node ---


def test_update_node_sets_run_and_creates_binding(started: RunProjection, clock: FakeClock) -> None:
    now = clock.advance(seconds=2)

    started.update_node("r1", RunState.RUNNING, "build", "visit-1")

    run = started.get_run("r1")
    assert (run.state, run.current_node, run.current_node_visit_id) == (
        RunState.RUNNING,
        "build",
        "visit-1",
    )
    assert run.updated_at == now
    assert started.get_node_runtime("r1", "build") == NodeRuntime(
        run_id="r1",
        node="build",
        terminal_id=None,
        session_id=None,
        node_visit_id="visit-1",
        updated_at=now,
    )


def test_update_node_accepts_state_string(started: RunProjection) -> None:
    started.update_node("r1", "waiting", "review", "v1")
    assert started.get_run("r1").state is RunState.WAITING


def test_update_node_revisit_keeps_terminal_and_session(
    started: RunProjection, clock: FakeClock
) -> None:
    started.update_node("r1", RunState.RUNNING, "build", "visit-1")
    started.update_node_runtime(
        NodeRuntime(
            "r1", "build", terminal_id="term-1", session_id="sess-1", node_visit_id="visit-1"
        )
    )
    started.update_node("r1", RunState.RUNNING, "test", "visit-2")
    now = clock.advance(seconds=10)

    started.update_node("r1", RunState.RUNNING, "build", "visit-3")

    assert started.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", "term-1", "sess-1", "visit-3", now
    )
    run = started.get_run("r1")
    assert (run.current_node, run.current_node_visit_id) == ("build", "visit-3")
    # The node left behind keeps its own binding.
    assert started.get_node_runtime("r1", "test").node_visit_id == "visit-2"


def test_update_node_replayed_is_idempotent(started: RunProjection, table_rows: Rows) -> None:
    started.update_node("r1", RunState.RUNNING, "build", "visit-1")
    runs_before = table_rows("relay_runs")
    runtime_before = table_rows("relay_node_runtime")

    started.update_node("r1", RunState.RUNNING, "build", "visit-1")

    assert table_rows("relay_runs") == runs_before
    assert table_rows("relay_node_runtime") == runtime_before


def test_update_node_does_not_touch_error_retry_or_finish(started: RunProjection) -> None:
    status = RetryStatus(1, "flaky", T0 + timedelta(minutes=1))
    started.update_state("r1", RunState.RUNNING, "old error", T0 + timedelta(minutes=3))
    started.update_retry("r1", status)

    started.update_node("r1", RunState.RUNNING, "build", "v1")

    run = started.get_run("r1")
    assert run.last_error == "old error"
    assert run.retry == status
    assert run.finished_at == T0 + timedelta(minutes=3)


def test_update_node_unknown_run_raises_and_creates_no_binding(
    started: RunProjection, table_rows: Rows
) -> None:
    runs_before = table_rows("relay_runs")

    with pytest.raises(RunNotFound, match="ghost"):
        started.update_node("ghost", RunState.RUNNING, "build", "visit-1")

    assert table_rows("relay_runs") == runs_before
    assert table_rows("relay_node_runtime") == []


def test_update_node_unknown_state_raises_and_changes_nothing(
    started: RunProjection, table_rows: Rows
) -> None:
    before = (table_rows("relay_runs"), table_rows("relay_node_runtime"))
    with pytest.raises(ValueError, match="state"):
        started.update_node("r1", "sprinting", "build", "v1")
    assert (table_rows("relay_runs"), table_rows("relay_node_runtime")) == before


@pytest.fixture
def fail_on_node_runtime_write(observed_engine: Engine) -> Iterator[None]:
    """Make the node runtime half of update_node fail after the run half ran."""

    def before_cursor_execute(
        conn: object,
        cursor: object,
        statement: str,
        parameters: object,
        context: object,
        executemany: bool,
    ) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO RELAY_NODE_RUNTIME"):
            raise RuntimeError("injected failure")

    sa.event.listen(observed_engine, "before_cursor_execute", before_cursor_execute)
    yield
    sa.event.remove(observed_engine, "before_cursor_execute", before_cursor_execute)


def test_update_node_is_one_transaction(
    started: RunProjection, table_rows: Rows, fail_on_node_runtime_write: None
) -> None:
    before = table_rows("relay_runs")

    with pytest.raises(RuntimeError, match="injected failure"):
        started.update_node("r1", RunState.RUNNING, "build", "visit-1")

    # The run update that preceded the failing upsert was rolled back with it.
    assert table_rows("relay_runs") == before
    assert table_rows("relay_node_runtime") == []


# --------------------------------------------------------------- the reads ---


def test_get_run_unknown_raises_run_not_found_naming_the_run(projection: RunProjection) -> None:
    with pytest.raises(RunNotFound, match="no-such-run") as info:
        projection.get_run("no-such-run")
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, ProjectionError)


def test_find_run_by_ticket_returns_latest_started(projection: RunProjection) -> None:
    # Inserted out of order; attempt numbers deliberately disagree with time.
    projection.insert_start(start("a3", ticket_key="K", attempt_id=3), T0)
    projection.insert_start(start("a1", ticket_key="K", attempt_id=1), T0 + timedelta(hours=1))
    projection.insert_start(start("a2", ticket_key="K", attempt_id=2), T0 + timedelta(minutes=1))
    projection.insert_start(start("other", ticket_key="K2"), T0 + timedelta(days=1))

    assert projection.find_run_by_ticket("K").id == "a1"


def test_find_run_by_ticket_breaks_started_at_tie_by_attempt(projection: RunProjection) -> None:
    projection.insert_start(start("z-attempt-2", ticket_key="K", attempt_id=2), T0)
    projection.insert_start(start("a-attempt-5", ticket_key="K", attempt_id=5), T0)
    projection.insert_start(start("m-attempt-1", ticket_key="K", attempt_id=1), T0)

    assert projection.find_run_by_ticket("K").id == "a-attempt-5"


def test_find_run_by_ticket_matches_ticket_key_not_ticket_id(projection: RunProjection) -> None:
    projection.insert_start(start("r1", ticket_id="SHARED", ticket_key="KEY-1"), T0)

    with pytest.raises(RunNotFound, match="SHARED"):
        projection.find_run_by_ticket("SHARED")
    assert projection.find_run_by_ticket("KEY-1").id == "r1"


def test_find_run_by_ticket_unknown_names_the_ticket(projection: RunProjection) -> None:
    projection.insert_start(start(), T0)
    with pytest.raises(RunNotFound, match="ACME-404"):
        projection.find_run_by_ticket("ACME-404")


def test_find_run_by_logical_id_returns_latest_attempt(projection: RunProjection) -> None:
    projection.insert_start(start("L#1", logical_id="L", attempt_id=1), T0)
    projection.insert_start(start("L#2", logical_id="L", attempt_id=2), T0 + timedelta(minutes=5))
    projection.insert_start(start("M#9", logical_id="M", attempt_id=9), T0 + timedelta(hours=5))

    found = projection.find_run_by_logical_id("L")
    assert (found.id, found.attempt_id) == ("L#2", 2)


def test_find_run_by_logical_id_breaks_tie_by_attempt(projection: RunProjection) -> None:
    projection.insert_start(start("b", logical_id="L", attempt_id=4), T0)
    projection.insert_start(start("a", logical_id="L", attempt_id=2), T0)
    projection.insert_start(start("c", logical_id="L", attempt_id=3), T0)

    assert projection.find_run_by_logical_id("L").id == "b"


def test_find_run_by_logical_id_matches_defaulted_logical_id(projection: RunProjection) -> None:
    projection.insert_start(start("solo"), T0)
    assert projection.find_run_by_logical_id("solo").id == "solo"


def test_find_run_by_logical_id_unknown_names_it(projection: RunProjection) -> None:
    projection.insert_start(start("r1", logical_id="L"), T0)
    with pytest.raises(RunNotFound, match="r1-logical-missing"):
        projection.find_run_by_logical_id("r1-logical-missing")
