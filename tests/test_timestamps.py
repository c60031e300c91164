"""Timestamps across the API: aware UTC out, microseconds kept, zones converted, naive refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest
import sqlalchemy as sa
from fakes import IST, FakeClock, OwnText, as_subclass
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeRuntime,
    NodeSessionRegistration,
    RetryStatus,
    Run,
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
    create_engine,
    upgrade,
)
from relay_flow_projection.timestamps import require_aware

Rows = Callable[[str], list[tuple[object, ...]]]
ALL_TABLES = (
    "relay_runs",
    "relay_node_runtime",
    "relay_node_sessions",
    "relay_processed_reports",
    "relay_executor_identity",
)

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)
NEW_YORK_WINTER = timezone(timedelta(hours=-5))


def start(run_id: str = "r1", ticket_key: str = "K") -> RunStart:
    return RunStart(id=run_id, repo="repo", workflow="wf", ticket_id="T", ticket_key=ticket_key)


def snapshot(table_rows: Rows) -> dict[str, list[tuple[object, ...]]]:
    return {table: table_rows(table) for table in ALL_TABLES}


def run_timestamps(run: Run) -> list[datetime]:
    stamps = [run.started_at, run.updated_at]
    if run.finished_at is not None:
        stamps.append(run.finished_at)
    if run.retry is not None:
        stamps.append(run.retry.next_retry_at)
    return stamps


# ---------------------------------------------------------------- UTC output ---


def test_every_output_timestamp_is_aware_utc(projection: RunProjection) -> None:
    projection.insert_start(start(), T0.astimezone(IST))
    projection.update_retry("r1", RetryStatus(1, "e", T0.astimezone(NEW_YORK_WINTER)))
    projection.update_state("r1", RunState.CANCELING, finished_at=T0.astimezone(IST))
    projection.update_node("r1", RunState.RUNNING, "build", "v1")

    runs = [
        projection.get_run("r1"),
        projection.find_run_by_ticket("K"),
        projection.find_run_by_logical_id("r1"),
        *projection.list_runs(),
        *projection.iter_runs(batch_size=1),
    ]
    stamps = [stamp for run in runs for stamp in run_timestamps(run)]
    runtimes = [
        projection.get_node_runtime("r1", "build"),
        projection.load_node_runtime("r1", "build"),
        *projection.list_node_runtimes("r1"),
    ]
    stamps += [rt.updated_at for rt in runtimes if rt.updated_at is not None]

    assert len(stamps) == 5 * 4 + 3
    for stamp in stamps:
        assert stamp.tzinfo is UTC  # datetime.UTC is datetime.timezone.utc


@pytest.mark.parametrize("microsecond", [0, 1, 9, 10, 500000, 999999])
def test_microseconds_are_preserved(projection: RunProjection, microsecond: int) -> None:
    when = T0.replace(microsecond=microsecond)
    projection.insert_start(start(), when)
    projection.update_state("r1", RunState.COMPLETED, finished_at=when + timedelta(seconds=1))
    projection.update_retry("r1", RetryStatus(1, "e", when + timedelta(seconds=2)))

    run = projection.get_run("r1")
    assert run.started_at == when
    assert run.started_at.microsecond == microsecond
    assert run.finished_at == when + timedelta(seconds=1)
    assert run.finished_at.microsecond == microsecond
    assert run.retry is not None
    assert run.retry.next_retry_at.microsecond == microsecond


def test_clock_microseconds_are_preserved(projection: RunProjection, clock: FakeClock) -> None:
    clock.now = datetime(2026, 5, 5, 5, 5, 5, 1, tzinfo=UTC)
    projection.insert_start(start(), T0)
    projection.update_state("r1", RunState.RUNNING)
    assert projection.get_run("r1").updated_at == clock.now


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 18, 59, 59, 999999, tzinfo=NEW_YORK_WINTER),
        datetime(1, 1, 1, 5, 30, tzinfo=IST),
    ],
    ids=["min", "epoch", "max", "max-in-new-york", "min-in-india"],
)
def test_extreme_representable_values_round_trip(projection: RunProjection, when: datetime) -> None:
    projection.insert_start(start(), when)
    projection.update_state("r1", RunState.COMPLETED, finished_at=when)

    run = projection.get_run("r1")
    assert run.started_at == when
    assert run.finished_at == when
    assert run.started_at.tzinfo is UTC


# ------------------------------------------------------------ other time zones ---


def test_non_utc_input_is_converted(projection: RunProjection, engine: Engine) -> None:
    local = datetime(2026, 3, 1, 9, 30, 0, 250000, tzinfo=IST)
    projection.insert_start(start(), local)

    run = projection.get_run("r1")
    assert run.started_at == local
    assert run.started_at.tzinfo is UTC
    assert (run.started_at.hour, run.started_at.minute) == (4, 0)
    assert run.started_at.microsecond == 250000


def test_non_utc_clock_is_converted(projection: RunProjection, clock: FakeClock) -> None:
    clock.now = datetime(2026, 3, 1, 23, 30, tzinfo=NEW_YORK_WINTER)
    projection.insert_start(start(), T0)
    projection.update_state("r1", RunState.RUNNING)

    updated = projection.get_run("r1").updated_at
    assert updated == clock.now
    assert updated.tzinfo is UTC
    assert (updated.day, updated.hour) == (2, 4)


def test_ordering_is_by_instant_across_offsets(projection: RunProjection) -> None:
    # Wall-clock text would sort these the other way round.
    early = datetime(2026, 3, 1, 10, 0, tzinfo=IST)  # 04:30Z
    late = datetime(2026, 3, 1, 5, 0, tzinfo=UTC)  # 05:00Z
    later = datetime(2026, 3, 1, 0, 30, tzinfo=NEW_YORK_WINTER)  # 05:30Z
    projection.insert_start(start("a-later", "K"), later)
    projection.insert_start(start("b-early", "K"), early)
    projection.insert_start(start("c-late", "K"), late)

    assert [run.id for run in projection.list_runs()] == ["b-early", "c-late", "a-later"]
    assert projection.find_run_by_ticket("K").id == "a-later"


def test_ordering_by_microseconds(projection: RunProjection) -> None:
    # Ids sort opposite to time, so a tie-break on id would give the wrong order.
    base = datetime(2026, 3, 1, 12, 0, 0, 9, tzinfo=UTC)
    projection.insert_start(start("c", "K"), base)
    projection.insert_start(start("b", "K"), base + timedelta(microseconds=1))
    projection.insert_start(start("a", "K"), base + timedelta(microseconds=991))

    assert [run.id for run in projection.list_runs()] == ["c", "b", "a"]
    assert [run.id for run in projection.iter_runs(batch_size=1)] == ["c", "b", "a"]
    assert projection.find_run_by_ticket("K").id == "a"
    cursor = projection.get_run("c")
    assert [run.id for run in projection.list_runs(after=cursor)] == ["b", "a"]


def test_keyset_cursor_works_across_offsets(projection: RunProjection) -> None:
    projection.insert_start(start("x"), datetime(2026, 3, 1, 10, 0, tzinfo=IST))
    projection.insert_start(start("y"), datetime(2026, 3, 1, 4, 30, 0, 1, tzinfo=UTC))
    projection.insert_start(start("z"), datetime(2026, 3, 1, 4, 29, 59, 999999, tzinfo=UTC))

    cursor = projection.get_run("z")
    assert [run.id for run in projection.list_runs(after=cursor)] == ["x", "y"]


def test_sweep_cutoff_compares_instants(projection: RunProjection) -> None:
    cutoff = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    finished = {
        "just-before": (cutoff - timedelta(microseconds=1)).astimezone(IST),
        "exactly-at": cutoff.astimezone(NEW_YORK_WINTER),
        "just-after": (cutoff + timedelta(microseconds=1)).astimezone(IST),
        "wall-clock-later-but-earlier": datetime(2026, 3, 1, 17, 0, tzinfo=IST),  # 11:30Z
        "wall-clock-earlier-but-later": datetime(2026, 3, 1, 7, 30, tzinfo=NEW_YORK_WINTER),
    }
    for run_id, when in finished.items():
        projection.insert_start(start(run_id), T0)
        projection.update_state(run_id, RunState.COMPLETED, finished_at=when)

    assert projection.count_sweepable(cutoff.astimezone(IST)) == 2
    deleted = projection.sweep_retention(cutoff.astimezone(NEW_YORK_WINTER))
    assert sorted(deleted) == ["just-before", "wall-clock-later-but-earlier"]


# ------------------------------------------------------------------ refusals ---

NAIVE = datetime(2026, 3, 1, 12, 0)
OUT_OF_RANGE = [
    pytest.param(datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=5))), id="year1+05"),
    pytest.param(datetime(9999, 12, 31, 23, 0, tzinfo=NEW_YORK_WINTER), id="year9999-05"),
]
Call = Callable[[RunProjection, datetime], object]
TIMESTAMP_ARGUMENTS: list[tuple[str, Call]] = [
    ("insert_start", lambda p, t: p.insert_start(start("new"), t)),
    ("update_state", lambda p, t: p.update_state("r1", RunState.COMPLETED, "x", t)),
    ("update_retry", lambda p, t: p.update_retry("r1", RetryStatus(2, "x", t))),
    ("sweep_retention", lambda p, t: p.sweep_retention(t)),
    ("count_sweepable", lambda p, t: p.count_sweepable(t)),
]


@pytest.fixture
def populated(projection: RunProjection) -> RunProjection:
    projection.insert_start(start("r1"), T0)
    projection.update_retry("r1", RetryStatus(1, "old", T0))
    projection.update_node("r1", RunState.RUNNING, "build", "v1")
    projection.insert_start(start("old"), T0)
    projection.update_state("old", RunState.COMPLETED, finished_at=T0)
    return projection


@pytest.mark.parametrize(
    ("name", "call"), TIMESTAMP_ARGUMENTS, ids=[n for n, _ in TIMESTAMP_ARGUMENTS]
)
def test_naive_input_raises_and_changes_nothing(
    populated: RunProjection, table_rows: Rows, name: str, call: Call
) -> None:
    before = snapshot(table_rows)
    with pytest.raises(ValueError, match=r"naive|aware|timezone"):
        call(populated, NAIVE)
    assert snapshot(table_rows) == before


@pytest.mark.parametrize(
    ("name", "call"), TIMESTAMP_ARGUMENTS, ids=[n for n, _ in TIMESTAMP_ARGUMENTS]
)
@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_out_of_range_input_raises_and_changes_nothing(
    populated: RunProjection, table_rows: Rows, name: str, call: Call, when: datetime
) -> None:
    before = snapshot(table_rows)
    with pytest.raises(ValueError, match="range"):
        call(populated, when)
    assert snapshot(table_rows) == before


CLOCKED: list[tuple[str, Callable[[RunProjection], object]]] = [
    ("update_state", lambda p: p.update_state("r1", RunState.COMPLETED)),
    ("update_retry", lambda p: p.update_retry("r1", None)),
    ("update_node", lambda p: p.update_node("r1", RunState.RUNNING, "test", "v2")),
    (
        "update_node_runtime",
        lambda p: p.update_node_runtime(NodeRuntime("r1", "x", None, None, "v")),
    ),
    ("update_node_runtime_visit", lambda p: p.update_node_runtime_visit("r1", "build", "v2")),
    ("replace_node_runtime", lambda p: p.replace_node_runtime("r1", "build", "v1", "t", None, "s")),
    (
        "clear_node_runtime",
        lambda p: p.clear_node_runtime("r1", "build", clear_terminal=True, clear_session=True),
    ),
    (
        "register_node_session",
        lambda p: p.register_node_session(NodeSessionRegistration("r1", "build", "s")),
    ),
    ("record_processed_report", lambda p: p.record_processed_report("r1", "v1", "rep")),
]


@pytest.mark.parametrize(("name", "call"), CLOCKED, ids=[n for n, _ in CLOCKED])
@pytest.mark.parametrize(
    "bad_now",
    [NAIVE, datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))],
    ids=["naive", "out-of-range"],
)
def test_bad_clock_raises_and_changes_nothing(
    populated: RunProjection,
    clock: FakeClock,
    table_rows: Rows,
    name: str,
    call: Callable[[RunProjection], object],
    bad_now: datetime,
) -> None:
    before = snapshot(table_rows)
    clock.now = bad_now
    with pytest.raises(ValueError, match="clock"):
        call(populated)
    assert snapshot(table_rows) == before


def test_run_projection_default_clock_is_aware_utc(engine: Engine) -> None:
    projection = RunProjection(engine)
    projection.insert_start(start(), T0)
    before = datetime.now(UTC)
    projection.update_state("r1", RunState.RUNNING)
    after = datetime.now(UTC)

    updated = projection.get_run("r1").updated_at
    assert updated.tzinfo is UTC
    assert before <= updated <= after


# ------------------------------------------------- PostgreSQL session time zone ---


def test_postgresql_sessions_run_in_utc_whatever_the_url_asks(postgres_url: str) -> None:
    url = sa.make_url(postgres_url)
    options = f"{url.query['options']} -ctimezone=Asia/Kolkata"
    target = url.update_query_dict({"options": options}).render_as_string(hide_password=False)
    upgrade(target)
    engine = create_engine(target)
    try:
        with engine.connect() as connection:
            # The engine sets the session to UTC on connect, overriding the URL.
            assert connection.exec_driver_sql("SHOW TIME ZONE").scalar_one() == "UTC"
        projection = RunProjection(engine, clock=FakeClock())
        when = datetime(2026, 3, 1, 23, 59, 59, 999999, tzinfo=UTC)
        projection.insert_start(start("late"), when)
        projection.insert_start(start("early"), when - timedelta(microseconds=1))
        projection.update_state("late", RunState.COMPLETED, finished_at=when.astimezone(IST))

        run = projection.get_run("late")
        assert run.started_at == when
        assert run.started_at.tzinfo is UTC
        assert (run.started_at.day, run.started_at.hour) == (1, 23)
        assert run.finished_at == when
        assert run.finished_at is not None
        assert run.finished_at.tzinfo is UTC
        assert [r.id for r in projection.list_runs(RunFilter())] == ["early", "late"]
        assert projection.count_sweepable(when) == 0
        assert projection.count_sweepable(when + timedelta(microseconds=1)) == 1
    finally:
        engine.dispose()


# ------------------------------------------------------------ datetime subclasses ---


class IgnoresZones(OwnText):
    """A subclass whose astimezone() answers in its own zone, whatever is asked."""

    def astimezone(self, tz: tzinfo | None = None) -> IgnoresZones:
        return self


@pytest.mark.parametrize("kind", [OwnText, IgnoresZones])
@pytest.mark.parametrize("zone", [UTC, IST, NEW_YORK_WINTER], ids=["utc", "ist", "new-york"])
def test_require_aware_returns_a_plain_utc_datetime(kind: type[datetime], zone: tzinfo) -> None:
    value = as_subclass(kind, T0.astimezone(zone))
    utc = require_aware(value, "now")
    assert type(utc) is datetime
    assert utc.tzinfo is UTC
    assert utc == T0
    assert utc.isoformat(sep=" ") == "2026-02-01 08:30:00.654321+00:00"


@pytest.mark.parametrize("kind", [OwnText, IgnoresZones])
def test_subclass_timestamps_are_stored_canonically(
    projection: RunProjection, engine: Engine, kind: type[datetime]
) -> None:
    """Stored as plain UTC, so listing, ordering and cutoffs work as for any datetime.

    SQLite used to store the subclass's own text: every later listing raised."""
    stamps = {"c": T0 + timedelta(hours=1), "a": T0 - timedelta(hours=1), "b": T0}
    zones = {"c": NEW_YORK_WINTER, "a": IST, "b": UTC}
    for run_id, when in stamps.items():
        local = as_subclass(kind, when.astimezone(zones[run_id]))
        projection.insert_start(start(run_id, ticket_key=run_id), local)
        projection.update_state(run_id, RunState.COMPLETED, finished_at=local)

    assert [run.id for run in projection.list_runs()] == ["a", "b", "c"]
    assert [run.id for run in projection.iter_runs(batch_size=1)] == ["a", "b", "c"]
    for run_id, when in stamps.items():
        run = projection.get_run(run_id)
        assert (run.started_at, run.finished_at) == (when, when)
    cursor = as_subclass(kind, T0.astimezone(IST))
    after = replace(projection.get_run("b"), started_at=cursor)
    assert [run.id for run in projection.list_runs(after=after)] == ["c"]
    assert projection.count_sweepable(as_subclass(kind, T0.astimezone(NEW_YORK_WINTER))) == 1
    if engine.dialect.name == "sqlite":
        with engine.connect() as connection:
            texts = connection.exec_driver_sql(
                "SELECT started_at, finished_at FROM relay_runs ORDER BY id"
            ).all()
        assert texts == [
            ("2026-02-01 07:30:00.654321+00:00",) * 2,
            ("2026-02-01 08:30:00.654321+00:00",) * 2,
            ("2026-02-01 09:30:00.654321+00:00",) * 2,
        ]
