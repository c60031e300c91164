"""register_node_session and processed-report receipts, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from fakes import FakeClock
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeRuntime,
    NodeSessionRegistration,
    RunNotFound,
    RunProjection,
    RunStart,
    RunState,
)
from relay_flow_projection.schema import node_sessions, processed_reports

Rows = Callable[[str], list[tuple[object, ...]]]

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)


def start(run_id: str) -> RunStart:
    return RunStart(id=run_id, repo="acme/api", workflow="deploy", ticket_id="T", ticket_key="K")


def typed_rows(engine: Engine, table: sa.Table) -> list[tuple[object, ...]]:
    """Rows read through the schema's column types (timestamps as aware datetimes)."""
    with engine.connect() as connection:
        query = sa.select(table).order_by(*table.primary_key)
        return [tuple(row) for row in connection.execute(query)]


def reg(session: str, node: str = "build", run_id: str = "r1") -> NodeSessionRegistration:
    return NodeSessionRegistration(run_id=run_id, node=node, session_id=session)


@pytest.fixture
def runs(projection: RunProjection) -> RunProjection:
    projection.insert_start(start("r1"), T0)
    projection.insert_start(start("r2"), T0)
    return projection


@pytest.fixture
def visiting(runs: RunProjection) -> RunProjection:
    """r1 is at node build, visit v1, with no session bound."""
    runs.update_node("r1", RunState.RUNNING, "build", "v1")
    return runs


# ---------------------------------------------------- register_node_session ---


def test_register_without_binding_returns_false_and_records_nothing(
    runs: RunProjection, table_rows: Rows
) -> None:
    assert runs.register_node_session(reg("s1")) is False
    assert runs.register_node_session(reg("s1", run_id="ghost")) is False
    assert table_rows("relay_node_sessions") == []
    assert table_rows("relay_node_runtime") == []


def test_register_binding_of_other_node_does_not_count(
    visiting: RunProjection, table_rows: Rows
) -> None:
    assert visiting.register_node_session(reg("s1", node="test")) is False
    assert table_rows("relay_node_sessions") == []


def test_first_registration_records_and_binds(
    visiting: RunProjection, clock: FakeClock, engine: Engine
) -> None:
    now = clock.advance(seconds=7)

    assert visiting.register_node_session(reg("s1")) is True

    assert visiting.get_node_runtime("r1", "build") == NodeRuntime(
        "r1", "build", None, "s1", "v1", now
    )
    assert typed_rows(engine, node_sessions) == [("r1", "build", "s1", "v1", now)]


def test_registration_keeps_terminal(visiting: RunProjection) -> None:
    visiting.update_node_runtime(NodeRuntime("r1", "build", "term", None, "v1"))
    assert visiting.register_node_session(reg("s1")) is True
    got = visiting.get_node_runtime("r1", "build")
    assert (got.terminal_id, got.session_id) == ("term", "s1")


def test_repeat_registration_is_idempotent(visiting: RunProjection, table_rows: Rows) -> None:
    assert visiting.register_node_session(reg("s1")) is True
    sessions = table_rows("relay_node_sessions")

    assert visiting.register_node_session(reg("s1")) is True

    assert table_rows("relay_node_sessions") == sessions
    assert visiting.get_node_runtime("r1", "build").session_id == "s1"


def test_session_of_earlier_visit_never_binds_to_later_one(
    visiting: RunProjection, table_rows: Rows
) -> None:
    assert visiting.register_node_session(reg("s1")) is True
    visiting.clear_node_runtime("r1", "build", clear_terminal=False, clear_session=True)
    visiting.update_node("r1", RunState.RUNNING, "build", "v2")
    sessions = table_rows("relay_node_sessions")

    assert visiting.register_node_session(reg("s1")) is False

    runtime = visiting.get_node_runtime("r1", "build")
    assert (runtime.session_id, runtime.node_visit_id) == (None, "v2")
    # The session stays recorded under the visit it was first seen in.
    assert table_rows("relay_node_sessions") == sessions


def test_late_registration_does_not_replace_the_new_visits_session(
    visiting: RunProjection,
) -> None:
    # s-old is first seen under v1, but its registration result arrives late.
    assert visiting.register_node_session(reg("s-old")) is True
    visiting.update_node("r1", RunState.RUNNING, "build", "v2")
    assert visiting.register_node_session(reg("s-new")) is True

    assert visiting.register_node_session(reg("s-old")) is False

    assert visiting.get_node_runtime("r1", "build").session_id == "s-new"


def test_new_session_under_new_visit_binds(visiting: RunProjection, table_rows: Rows) -> None:
    assert visiting.register_node_session(reg("s1")) is True
    visiting.update_node("r1", RunState.RUNNING, "build", "v2")

    assert visiting.register_node_session(reg("s2")) is True

    assert visiting.get_node_runtime("r1", "build").session_id == "s2"
    recorded = {(row[2], row[3]) for row in table_rows("relay_node_sessions")}
    assert recorded == {("s1", "v1"), ("s2", "v2")}


def test_registration_when_visit_returns_to_first_seen_visit(visiting: RunProjection) -> None:
    # A visit id is what decides, not the order of events.
    assert visiting.register_node_session(reg("s1")) is True
    visiting.update_node_runtime_visit("r1", "build", "v2")
    assert visiting.register_node_session(reg("s1")) is False
    visiting.update_node_runtime_visit("r1", "build", "v1")
    assert visiting.register_node_session(reg("s1")) is True


def test_sessions_are_per_run_and_node(visiting: RunProjection) -> None:
    visiting.update_node("r1", RunState.RUNNING, "test", "v1")
    visiting.update_node("r2", RunState.RUNNING, "build", "w1")

    assert visiting.register_node_session(reg("shared", node="build")) is True
    assert visiting.register_node_session(reg("shared", node="test")) is True
    assert visiting.register_node_session(reg("shared", run_id="r2")) is True

    assert visiting.get_node_runtime("r1", "build").session_id == "shared"
    assert visiting.get_node_runtime("r1", "test").session_id == "shared"
    assert visiting.get_node_runtime("r2", "build").session_id == "shared"


# ------------------------------------------------------- processed reports ---


def test_has_processed_report_false_initially(runs: RunProjection) -> None:
    assert runs.has_processed_report("r1", "rep-1") is False
    assert runs.has_processed_report("ghost", "rep-1") is False


def test_record_then_has(runs: RunProjection, clock: FakeClock, engine: Engine) -> None:
    now = clock.advance(seconds=1)

    runs.record_processed_report("r1", "v1", "rep-1")

    assert runs.has_processed_report("r1", "rep-1") is True
    assert runs.has_processed_report("r1", "rep-2") is False
    assert runs.has_processed_report("r2", "rep-1") is False
    assert typed_rows(engine, processed_reports) == [("r1", "rep-1", "v1", now)]


def test_record_is_idempotent_and_keeps_the_first(
    runs: RunProjection, clock: FakeClock, engine: Engine
) -> None:
    runs.record_processed_report("r1", "v1", "rep-1")
    first_seen = clock()
    clock.advance(seconds=60)

    runs.record_processed_report("r1", "v1", "rep-1")
    runs.record_processed_report("r1", "v2", "rep-1")

    assert typed_rows(engine, processed_reports) == [("r1", "rep-1", "v1", first_seen)]
    assert runs.has_processed_report("r1", "rep-1") is True


def test_same_report_id_in_two_runs_is_two_receipts(runs: RunProjection, table_rows: Rows) -> None:
    runs.record_processed_report("r1", "v1", "rep-1")
    runs.record_processed_report("r2", "v1", "rep-1")
    assert len(table_rows("relay_processed_reports")) == 2
    assert runs.has_processed_report("r2", "rep-1") is True


def test_record_unknown_run_raises_and_records_nothing(
    runs: RunProjection, table_rows: Rows
) -> None:
    with pytest.raises(RunNotFound, match="ghost"):
        runs.record_processed_report("ghost", "v1", "rep-1")
    assert table_rows("relay_processed_reports") == []
    assert runs.has_processed_report("ghost", "rep-1") is False
