"""Node runtime bindings: get/load/update/visit/replace/clear/list, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from fakes import FakeClock
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeRuntime,
    NodeRuntimeNotFound,
    NodeVisitNotCurrent,
    ProjectionError,
    RunNotFound,
    RunProjection,
    RunStart,
    RunState,
)
from relay_flow_projection.schema import node_runtime

Rows = Callable[[str], list[tuple[object, ...]]]

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)
CHILD_TABLES = ("relay_node_runtime", "relay_node_sessions", "relay_processed_reports")


def start(run_id: str) -> RunStart:
    return RunStart(id=run_id, repo="acme/api", workflow="deploy", ticket_id="T", ticket_key="K")


@pytest.fixture
def runs(projection: RunProjection) -> RunProjection:
    projection.insert_start(start("r1"), T0)
    projection.insert_start(start("r2"), T0)
    return projection


@pytest.fixture
def bound(runs: RunProjection, clock: FakeClock) -> RunProjection:
    """r1/build at visit v1 with terminal t1 and session s1."""
    runs.update_node_runtime(NodeRuntime("r1", "build", "t1", "s1", "v1"))
    clock.advance(seconds=1)
    return runs


def raw_runtime(engine: Engine, run_id: str, node: str) -> sa.Row[tuple[object, ...]]:
    with engine.connect() as connection:
        query = sa.select(node_runtime).where(
            node_runtime.c.run_id == run_id, node_runtime.c.node == node
        )
        return connection.execute(query).one()


def snapshot(table_rows: Rows) -> dict[str, list[tuple[object, ...]]]:
    return {table: table_rows(table) for table in ("relay_runs", *CHILD_TABLES)}


# ------------------------------------------------------------- get / load ---


def test_get_node_runtime_missing_raises_naming_run_and_node(runs: RunProjection) -> None:
    with pytest.raises(NodeRuntimeNotFound) as info:
        runs.get_node_runtime("r1", "deploy-step")
    message = str(info.value)
    assert "r1" in message
    assert "deploy-step" in message
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, ProjectionError)


def test_get_node_runtime_unknown_run_raises_not_found(projection: RunProjection) -> None:
    with pytest.raises(NodeRuntimeNotFound):
        projection.get_node_runtime("ghost", "build")


def test_load_node_runtime_missing_is_the_empty_binding(runs: RunProjection) -> None:
    loaded = runs.load_node_runtime("r1", "build")
    assert loaded == NodeRuntime(run_id="r1", node="build")
    assert loaded.node_visit_id is None
    assert loaded.updated_at is None
    assert loaded.terminal_id is None
    assert loaded.session_id is None


def test_load_node_runtime_does_not_create_a_row(runs: RunProjection, table_rows: Rows) -> None:
    runs.load_node_runtime("r1", "build")
    runs.load_node_runtime("ghost", "build")
    assert table_rows("relay_node_runtime") == []


def test_load_node_runtime_existing_equals_get(bound: RunProjection) -> None:
    assert bound.load_node_runtime("r1", "build") == bound.get_node_runtime("r1", "build")


# ---------------------------------------------------- update_node_runtime ---


def test_update_node_runtime_inserts_every_field(runs: RunProjection, clock: FakeClock) -> None:
    now = clock.advance(seconds=4)

    runs.update_node_runtime(
        NodeRuntime("r1", "build", terminal_id="t1", session_id="s1", node_visit_id="v1")
    )

    assert runs.get_node_runtime("r1", "build") == NodeRuntime("r1", "build", "t1", "s1", "v1", now)


def test_update_node_runtime_overwrites_every_field(bound: RunProjection, clock: FakeClock) -> None:
    now = clock.advance(seconds=4)

    bound.update_node_runtime(NodeRuntime("r1", "build", "t2", "s2", "v2"))

    assert bound.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", "t2", "s2", "v2", now
    )


@pytest.mark.parametrize("empty", [None, ""])
def test_update_node_runtime_empty_ids_are_stored_as_null(
    bound: RunProjection, engine: Engine, empty: str | None
) -> None:
    bound.update_node_runtime(NodeRuntime("r1", "build", empty, empty, "v2"))

    got = bound.get_node_runtime("r1", "build")
    assert (got.terminal_id, got.session_id, got.node_visit_id) == (None, None, "v2")
    row = raw_runtime(engine, "r1", "build")
    assert (row.terminal_id, row.session_id) == (None, None)


def test_update_node_runtime_ignores_given_updated_at(
    runs: RunProjection, clock: FakeClock
) -> None:
    stale = datetime(2001, 1, 1, tzinfo=UTC)
    runs.update_node_runtime(NodeRuntime("r1", "build", None, None, "v1", updated_at=stale))
    assert runs.get_node_runtime("r1", "build").updated_at == clock()


def test_update_node_runtime_unknown_run_raises_and_creates_nothing(
    runs: RunProjection, table_rows: Rows
) -> None:
    with pytest.raises(RunNotFound, match="ghost"):
        runs.update_node_runtime(NodeRuntime("ghost", "build", "t", "s", "v"))
    assert table_rows("relay_node_runtime") == []


def test_update_node_runtime_does_not_touch_the_run(runs: RunProjection, clock: FakeClock) -> None:
    before = runs.get_run("r1")
    clock.advance(seconds=1)
    runs.update_node_runtime(NodeRuntime("r1", "build", "t", "s", "v"))
    assert runs.get_run("r1") == before


# ---------------------------------------------- update_node_runtime_visit ---


def test_update_node_runtime_visit_creates_binding(runs: RunProjection, clock: FakeClock) -> None:
    runs.update_node_runtime_visit("r1", "build", "v1")
    assert runs.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", None, None, "v1", clock()
    )


def test_update_node_runtime_visit_keeps_terminal_and_session(
    bound: RunProjection, clock: FakeClock
) -> None:
    now = clock.advance(seconds=3)

    bound.update_node_runtime_visit("r1", "build", "v2")

    assert bound.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", "t1", "s1", "v2", now
    )


def test_update_node_runtime_visit_does_not_touch_the_run(
    runs: RunProjection, clock: FakeClock
) -> None:
    before = runs.get_run("r1")
    clock.advance(seconds=1)
    runs.update_node_runtime_visit("r1", "build", "v1")
    assert runs.get_run("r1") == before


def test_update_node_runtime_visit_unknown_run_raises_and_creates_nothing(
    runs: RunProjection, table_rows: Rows
) -> None:
    with pytest.raises(RunNotFound, match="ghost"):
        runs.update_node_runtime_visit("ghost", "build", "v1")
    assert table_rows("relay_node_runtime") == []


# ------------------------------------------------ node_runtime_visit_is_current ---


def test_visit_is_current(bound: RunProjection) -> None:
    assert bound.node_runtime_visit_is_current("r1", "build", "v1")
    assert not bound.node_runtime_visit_is_current("r1", "build", "v0")
    assert not bound.node_runtime_visit_is_current("r1", "test", "v1")
    assert not bound.node_runtime_visit_is_current("r2", "build", "v1")
    assert not bound.node_runtime_visit_is_current("ghost", "build", "v1")

    bound.update_node("r1", RunState.RUNNING, "build", "v2")
    assert bound.node_runtime_visit_is_current("r1", "build", "v2")
    assert not bound.node_runtime_visit_is_current("r1", "build", "v1")


# ------------------------------------------------------ replace_node_runtime ---


def test_replace_sets_terminal_and_session_when_previous_matches(
    bound: RunProjection, clock: FakeClock
) -> None:
    now = clock.advance(seconds=2)

    bound.replace_node_runtime("r1", "build", "v1", "t2", "s1", "s2")

    assert bound.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", "t2", "s2", "v1", now
    )


def test_replace_keeps_session_when_previous_differs(
    bound: RunProjection, clock: FakeClock
) -> None:
    now = clock.advance(seconds=2)

    bound.replace_node_runtime("r1", "build", "v1", "t2", "someone-else", "s2")

    # The terminal is still set; only the session swap is refused.
    assert bound.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", "t2", "s1", "v1", now
    )


@pytest.mark.parametrize("previous", [None, ""])
def test_replace_previous_none_matches_no_session(
    runs: RunProjection, previous: str | None
) -> None:
    runs.update_node_runtime_visit("r1", "build", "v1")  # no session yet

    runs.replace_node_runtime("r1", "build", "v1", "t1", previous, "s1")

    got = runs.get_node_runtime("r1", "build")
    assert (got.terminal_id, got.session_id) == ("t1", "s1")


@pytest.mark.parametrize("previous", [None, ""])
def test_replace_previous_none_does_not_match_a_stored_session(
    bound: RunProjection, previous: str | None
) -> None:
    bound.replace_node_runtime("r1", "build", "v1", "t2", previous, "s2")

    got = bound.get_node_runtime("r1", "build")
    assert (got.terminal_id, got.session_id) == ("t2", "s1")


@pytest.mark.parametrize("empty", [None, ""])
def test_replace_can_clear_terminal_and_session(
    bound: RunProjection, engine: Engine, empty: str | None
) -> None:
    bound.replace_node_runtime("r1", "build", "v1", empty, "s1", empty)

    got = bound.get_node_runtime("r1", "build")
    assert (got.terminal_id, got.session_id, got.node_visit_id) == (None, None, "v1")
    row = raw_runtime(engine, "r1", "build")
    assert (row.terminal_id, row.session_id) == (None, None)


def test_replace_on_old_visit_raises_and_changes_nothing(
    bound: RunProjection, table_rows: Rows
) -> None:
    bound.update_node_runtime_visit("r1", "build", "v2")
    before = snapshot(table_rows)

    with pytest.raises(NodeVisitNotCurrent) as info:
        bound.replace_node_runtime("r1", "build", "v1", "t9", "s1", "s9")

    message = str(info.value)
    assert "r1" in message
    assert "build" in message
    assert "v1" in message
    assert snapshot(table_rows) == before


def test_replace_without_binding_raises_and_creates_nothing(
    runs: RunProjection, table_rows: Rows
) -> None:
    with pytest.raises(NodeVisitNotCurrent):
        runs.replace_node_runtime("r1", "build", "v1", "t1", None, "s1")
    with pytest.raises(NodeVisitNotCurrent):
        runs.replace_node_runtime("ghost", "build", "v1", "t1", None, "s1")
    assert table_rows("relay_node_runtime") == []


def test_replace_touches_only_its_node(bound: RunProjection) -> None:
    bound.update_node_runtime(NodeRuntime("r1", "test", "tt", "ts", "v1"))
    bound.update_node_runtime(NodeRuntime("r2", "build", "ot", "os", "v1"))
    before = [bound.get_node_runtime("r1", "test"), bound.get_node_runtime("r2", "build")]

    bound.replace_node_runtime("r1", "build", "v1", "t2", "s1", "s2")

    assert [bound.get_node_runtime("r1", "test"), bound.get_node_runtime("r2", "build")] == before


# --------------------------------------------------------- clear_node_runtime ---


@pytest.mark.parametrize(
    ("clear_terminal", "clear_session", "terminal", "session"),
    [
        (False, False, "t1", "s1"),
        (True, False, None, "s1"),
        (False, True, "t1", None),
        (True, True, None, None),
    ],
)
def test_clear_node_runtime_flags(
    bound: RunProjection,
    clock: FakeClock,
    clear_terminal: bool,
    clear_session: bool,
    terminal: str | None,
    session: str | None,
) -> None:
    now = clock.advance(seconds=5)

    bound.clear_node_runtime(
        "r1", "build", clear_terminal=clear_terminal, clear_session=clear_session
    )

    # As in the Go code, the binding's updated_at moves even when nothing is cleared.
    assert bound.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", terminal, session, "v1", now
    )


def test_clear_node_runtime_absent_binding_is_a_no_op(
    bound: RunProjection, table_rows: Rows
) -> None:
    before = snapshot(table_rows)

    bound.clear_node_runtime("r1", "test", clear_terminal=True, clear_session=True)
    bound.clear_node_runtime("ghost", "build", clear_terminal=True, clear_session=True)

    assert snapshot(table_rows) == before
    with pytest.raises(NodeRuntimeNotFound):
        bound.get_node_runtime("r1", "test")


def test_clear_node_runtime_touches_only_its_node(bound: RunProjection) -> None:
    bound.update_node_runtime(NodeRuntime("r1", "test", "tt", "ts", "v1"))
    bound.update_node_runtime(NodeRuntime("r2", "build", "ot", "os", "v1"))
    before = [bound.get_node_runtime("r1", "test"), bound.get_node_runtime("r2", "build")]

    bound.clear_node_runtime("r1", "build", clear_terminal=True, clear_session=True)

    assert [bound.get_node_runtime("r1", "test"), bound.get_node_runtime("r2", "build")] == before


# --------------------------------------------------------- list_node_runtimes ---


def test_list_node_runtimes_ordered_by_node(runs: RunProjection, clock: FakeClock) -> None:
    for node in ("deploy", "build", "test", "approve"):
        runs.update_node("r1", RunState.RUNNING, node, f"visit-{node}")
    runs.update_node_runtime(NodeRuntime("r2", "aaa", None, None, "x"))

    listed = runs.list_node_runtimes("r1")

    assert [rt.node for rt in listed] == ["approve", "build", "deploy", "test"]
    assert all(rt.run_id == "r1" for rt in listed)
    assert [rt.node_visit_id for rt in listed] == [f"visit-{rt.node}" for rt in listed]
    assert all(rt.updated_at == clock() for rt in listed)


def test_list_node_runtimes_matches_get(bound: RunProjection) -> None:
    bound.update_node_runtime(NodeRuntime("r1", "test", None, "s", "v3"))
    assert bound.list_node_runtimes("r1") == [
        bound.get_node_runtime("r1", "build"),
        bound.get_node_runtime("r1", "test"),
    ]


def test_list_node_runtimes_empty(runs: RunProjection) -> None:
    assert runs.list_node_runtimes("r1") == []
    assert runs.list_node_runtimes("ghost") == []
