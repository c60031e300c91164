"""list_runs / iter_runs / count_runs / has_active_* and retention sweeps, on both databases."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeRuntime,
    NodeSessionRegistration,
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
)

Rows = Callable[[str], list[tuple[object, ...]]]

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)
CHILD_TABLES = ("relay_node_runtime", "relay_node_sessions", "relay_processed_reports")


@dataclass(frozen=True)
class Seed:
    id: str
    repo: str
    workflow: str
    ticket_key: str
    state: RunState
    minute: int  # started_at = T0 + minute


# Inserted in this (shuffled) order; list order is (started_at, id).
SEEDS = (
    Seed("r05", "acme/api", "deploy", "API-2", RunState.COMPLETED, 5),
    Seed("r01", "acme/api", "deploy", "API-1", RunState.RUNNING, 1),
    Seed("r03b", "acme/web", "deploy", "WEB-1", RunState.CANCELED, 3),
    Seed("r07", "acme/web", "review", "WEB-2", RunState.BLOCKED, 7),
    Seed("r03a", "acme/api", "review", "API-1", RunState.WAITING, 3),
    Seed("r02", "acme/web", "review", "WEB-1", RunState.CANCELING, 2),
    Seed("r06", "acme/api", "deploy", "API-3", RunState.STARTING, 6),
    Seed("r04", "acme/web", "deploy", "WEB-3", RunState.COMPLETED, 4),
)
LIST_ORDER = ["r01", "r02", "r03a", "r03b", "r04", "r05", "r06", "r07"]
BY_ID = {seed.id: seed for seed in SEEDS}


def insert(projection: RunProjection, seed: Seed) -> None:
    projection.insert_start(
        RunStart(
            id=seed.id,
            repo=seed.repo,
            workflow=seed.workflow,
            ticket_id=f"ticket-id-of-{seed.ticket_key}",
            ticket_key=seed.ticket_key,
        ),
        T0 + timedelta(minutes=seed.minute),
    )
    if seed.state is not RunState.STARTING:
        projection.update_state(seed.id, seed.state)


@pytest.fixture
def seeded(projection: RunProjection) -> RunProjection:
    for seed in SEEDS:
        insert(projection, seed)
    return projection


def ids(runs: object) -> list[str]:
    assert isinstance(runs, list)
    return [run.id for run in runs]


def expected(predicate: Callable[[Seed], bool]) -> list[str]:
    return [run_id for run_id in LIST_ORDER if predicate(BY_ID[run_id])]


# ------------------------------------------------------------------ list_runs ---


def test_list_runs_orders_by_started_at_then_id(seeded: RunProjection) -> None:
    runs = seeded.list_runs()
    assert ids(runs) == LIST_ORDER
    assert ids(seeded.list_runs(None)) == LIST_ORDER
    assert ids(seeded.list_runs(RunFilter())) == LIST_ORDER
    starts = [run.started_at for run in runs]
    assert starts == sorted(starts)


def test_list_runs_empty_database(projection: RunProjection) -> None:
    assert projection.list_runs() == []
    assert projection.list_runs(RunFilter(active=True), limit=5) == []


def _case_id(value: object) -> str:
    """Test ids that are the same in every process (pytest-xdist compares them):
    the filter's text, not the predicate's address."""
    return repr(value)[:60] if isinstance(value, RunFilter) else "predicate"


FILTERS: list[tuple[RunFilter, Callable[[Seed], bool]]] = [
    (RunFilter(repo="acme/api"), lambda s: s.repo == "acme/api"),
    (RunFilter(workflow="review"), lambda s: s.workflow == "review"),
    (RunFilter(ticket="API-1"), lambda s: s.ticket_key == "API-1"),
    (RunFilter(active=True), lambda s: not s.state.is_terminal),
    (RunFilter(active=False), lambda s: s.state.is_terminal),
    (
        RunFilter(repo="acme/web", workflow="deploy"),
        lambda s: (s.repo, s.workflow) == ("acme/web", "deploy"),
    ),
    (
        RunFilter(repo="acme/web", active=True),
        lambda s: s.repo == "acme/web" and not s.state.is_terminal,
    ),
    (
        RunFilter(workflow="deploy", active=False),
        lambda s: s.workflow == "deploy" and s.state.is_terminal,
    ),
    (
        RunFilter(repo="acme/api", workflow="deploy", ticket="API-2", active=False),
        lambda s: s.id == "r05",
    ),
    (RunFilter(repo="acme/api", workflow="deploy", ticket="API-2", active=True), lambda s: False),
    (RunFilter(repo="nope"), lambda s: False),
    (RunFilter(ticket="ticket-id-of-API-1"), lambda s: False),  # ticket_id is not matched
    # As in the Go code, an empty filter value means "any".
    (RunFilter(repo="", workflow="", ticket=""), lambda s: True),
]


@pytest.mark.parametrize(("run_filter", "predicate"), FILTERS, ids=_case_id)
def test_list_runs_filters(
    seeded: RunProjection, run_filter: RunFilter, predicate: Callable[[Seed], bool]
) -> None:
    assert ids(seeded.list_runs(run_filter)) == expected(predicate)


@pytest.mark.parametrize(("run_filter", "predicate"), FILTERS, ids=_case_id)
def test_count_runs_agrees_with_list(
    seeded: RunProjection, run_filter: RunFilter, predicate: Callable[[Seed], bool]
) -> None:
    want: dict[RunState, int] = {}
    for run_id in expected(predicate):
        want[BY_ID[run_id].state] = want.get(BY_ID[run_id].state, 0) + 1
    counts = seeded.count_runs(run_filter)
    assert counts == want
    assert all(count > 0 for count in counts.values())
    assert all(isinstance(state, RunState) for state in counts)


def test_count_runs_omits_absent_states(projection: RunProjection) -> None:
    assert projection.count_runs() == {}
    insert(projection, Seed("a", "r", "w", "k", RunState.RUNNING, 0))
    insert(projection, Seed("b", "r", "w", "k", RunState.RUNNING, 1))
    insert(projection, Seed("c", "r", "w", "k", RunState.COMPLETED, 2))
    assert projection.count_runs() == {RunState.RUNNING: 2, RunState.COMPLETED: 1}
    assert projection.count_runs(RunFilter(active=True)) == {RunState.RUNNING: 2}
    assert projection.count_runs(RunFilter(repo="other")) == {}


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 8, 9, 100])
def test_list_runs_limit_caps_the_count(seeded: RunProjection, limit: int) -> None:
    assert ids(seeded.list_runs(limit=limit)) == LIST_ORDER[:limit]


def test_list_runs_limit_zero_is_empty(seeded: RunProjection) -> None:
    assert seeded.list_runs(limit=0) == []
    assert seeded.list_runs(RunFilter(active=True), limit=0) == []


@pytest.mark.parametrize("page_size", [1, 2, 3, 8])
def test_list_runs_keyset_paging_visits_every_run_once(
    seeded: RunProjection, page_size: int
) -> None:
    seen: list[str] = []
    page = seeded.list_runs(limit=page_size)
    while page:
        assert len(page) <= page_size
        seen.extend(ids(page))
        page = seeded.list_runs(limit=page_size, after=page[-1])
    assert seen == LIST_ORDER


def test_list_runs_after_is_strictly_after(seeded: RunProjection) -> None:
    by_id = {run.id: run for run in seeded.list_runs()}
    # r03a and r03b share started_at: the id breaks the tie.
    assert ids(seeded.list_runs(after=by_id["r03a"])) == LIST_ORDER[3:]
    assert ids(seeded.list_runs(after=by_id["r03b"])) == LIST_ORDER[4:]
    assert ids(seeded.list_runs(after=by_id["r02"], limit=2)) == ["r03a", "r03b"]
    assert seeded.list_runs(after=by_id["r07"]) == []


def test_list_runs_after_with_filter(seeded: RunProjection) -> None:
    by_id = {run.id: run for run in seeded.list_runs()}
    active = RunFilter(active=True)
    # The cursor run need not match the filter itself.
    assert ids(seeded.list_runs(active, after=by_id["r04"])) == ["r06", "r07"]
    assert ids(seeded.list_runs(active, after=by_id["r01"], limit=2)) == ["r02", "r03a"]


def test_list_runs_after_a_deleted_run_still_pages(seeded: RunProjection) -> None:
    cursor = seeded.get_run("r04")
    seeded.update_state("r04", RunState.COMPLETED, finished_at=T0)
    assert seeded.sweep_retention(T0 + timedelta(seconds=1)) == ["r04"]
    assert ids(seeded.list_runs(after=cursor)) == LIST_ORDER[5:]


# ------------------------------------------------------------------ iter_runs ---


@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 8, 9, 500])
def test_iter_runs_yields_list_order(seeded: RunProjection, batch_size: int) -> None:
    assert [run.id for run in seeded.iter_runs(batch_size=batch_size)] == LIST_ORDER


@pytest.mark.parametrize("batch_size", [1, 2, 3, 500])
@pytest.mark.parametrize(("run_filter", "predicate"), FILTERS[:6], ids=_case_id)
def test_iter_runs_with_filter(
    seeded: RunProjection,
    run_filter: RunFilter,
    predicate: Callable[[Seed], bool],
    batch_size: int,
) -> None:
    got = [run.id for run in seeded.iter_runs(run_filter, batch_size=batch_size)]
    assert got == expected(predicate)


def test_iter_runs_equals_list_runs(seeded: RunProjection) -> None:
    assert list(seeded.iter_runs(batch_size=3)) == seeded.list_runs()


def test_iter_runs_empty(projection: RunProjection) -> None:
    assert list(projection.iter_runs()) == []
    assert list(projection.iter_runs(batch_size=1)) == []


@pytest.fixture
def run_selects(observed_engine: Engine) -> Iterator[list[str]]:
    """Every SELECT statement on relay_runs issued through the engine (or its views)."""
    seen: list[str] = []

    def before_cursor_execute(
        conn: object,
        cursor: object,
        statement: str,
        parameters: object,
        context: object,
        executemany: bool,
    ) -> None:
        normalized = " ".join(statement.split()).upper()
        if normalized.startswith("SELECT") and "FROM RELAY_RUNS" in normalized:
            seen.append(normalized)

    sa.event.listen(observed_engine, "before_cursor_execute", before_cursor_execute)
    yield seen
    sa.event.remove(observed_engine, "before_cursor_execute", before_cursor_execute)


@pytest.mark.parametrize(("batch_size", "pages"), [(3, 3), (4, 3), (7, 2), (8, 2), (100, 1)])
def test_iter_runs_fetches_in_limited_pages(
    seeded: RunProjection, run_selects: list[str], batch_size: int, pages: int
) -> None:
    iterator = seeded.iter_runs(batch_size=batch_size)
    assert run_selects == []  # nothing is read before iteration starts

    first = next(iterator)
    assert first.id == "r01"
    assert len(run_selects) == 1  # only the first page was read

    rest = [run.id for run in iterator]
    assert [first.id, *rest] == LIST_ORDER
    # 8 runs: full pages, then a short (possibly empty) one that ends the iteration.
    assert len(run_selects) == pages
    assert all("LIMIT" in statement for statement in run_selects)


# ------------------------------------------------------- has_active_workflow/repo ---


def test_has_active_workflow_and_repo(projection: RunProjection) -> None:
    assert not projection.has_active_workflow("deploy")
    assert not projection.has_active_repo("acme/api")

    insert(projection, Seed("done", "acme/api", "deploy", "K", RunState.COMPLETED, 0))
    insert(projection, Seed("gone", "acme/api", "deploy", "K", RunState.CANCELED, 0))
    assert not projection.has_active_workflow("deploy")
    assert not projection.has_active_repo("acme/api")

    insert(projection, Seed("live", "acme/web", "review", "K", RunState.STARTING, 0))
    assert projection.has_active_workflow("review")
    assert projection.has_active_repo("acme/web")
    assert not projection.has_active_workflow("deploy")
    assert not projection.has_active_repo("acme/api")

    projection.update_state("live", RunState.COMPLETED)
    assert not projection.has_active_workflow("review")
    assert not projection.has_active_repo("acme/web")


@pytest.mark.parametrize("state", [s for s in RunState if not s.is_terminal])
def test_every_non_terminal_state_is_active(projection: RunProjection, state: RunState) -> None:
    insert(projection, Seed("r", "repo", "wf", "K", state, 0))
    assert projection.has_active_workflow("wf")
    assert projection.has_active_repo("repo")
    assert ids(projection.list_runs(RunFilter(active=True))) == ["r"]
    assert projection.list_runs(RunFilter(active=False)) == []


# ------------------------------------------------------------------ retention ---

CUTOFF = T0 + timedelta(days=30)


def add_children(projection: RunProjection, run_id: str) -> None:
    projection.update_node(run_id, projection.get_run(run_id).state, "build", "v1")
    projection.update_node_runtime(NodeRuntime(run_id, "test", "term", "sess", "v1"))
    assert projection.register_node_session(NodeSessionRegistration(run_id, "build", "s1"))
    projection.record_processed_report(run_id, "v1", "rep-1")
    projection.record_processed_report(run_id, "v1", "rep-2")


@pytest.fixture
def aged(projection: RunProjection) -> RunProjection:
    """Runs of every retention-relevant shape, each with child rows in all three tables."""
    shapes: list[tuple[str, RunState, datetime | None]] = [
        ("old-completed", RunState.COMPLETED, CUTOFF - timedelta(days=10)),
        ("old-canceled", RunState.CANCELED, CUTOFF - timedelta(microseconds=1)),
        ("at-cutoff", RunState.COMPLETED, CUTOFF),
        ("new-completed", RunState.COMPLETED, CUTOFF + timedelta(days=1)),
        ("terminal-unfinished", RunState.COMPLETED, None),
        ("running-old-finish", RunState.RUNNING, CUTOFF - timedelta(days=10)),
        ("canceling-old-finish", RunState.CANCELING, CUTOFF - timedelta(days=10)),
        ("blocked", RunState.BLOCKED, None),
    ]
    for index, (run_id, state, finished) in enumerate(shapes):
        insert(projection, Seed(run_id, "repo", "wf", f"K-{index}", RunState.STARTING, index))
        add_children(projection, run_id)
        projection.update_state(run_id, state, finished_at=finished)
    return projection


SWEPT = {"old-completed", "old-canceled"}


def child_run_ids(table_rows: Rows) -> dict[str, set[object]]:
    return {table: {row[0] for row in table_rows(table)} for table in CHILD_TABLES}


def test_sweep_deletes_only_expired_terminal_runs_and_their_children(
    aged: RunProjection, table_rows: Rows
) -> None:
    all_ids = {run.id for run in aged.list_runs()}
    assert child_run_ids(table_rows) == {table: all_ids for table in CHILD_TABLES}
    kept_children = {table: rows_of(table_rows, table, all_ids - SWEPT) for table in CHILD_TABLES}
    kept_runs = [run for run in aged.list_runs() if run.id not in SWEPT]

    deleted = aged.sweep_retention(CUTOFF)

    assert sorted(deleted) == sorted(SWEPT)
    assert len(deleted) == len(set(deleted))
    assert aged.list_runs() == kept_runs
    assert child_run_ids(table_rows) == {table: all_ids - SWEPT for table in CHILD_TABLES}
    for table in CHILD_TABLES:
        assert table_rows(table) == kept_children[table]


def rows_of(table_rows: Rows, table: str, run_ids: set[str]) -> list[tuple[object, ...]]:
    return [row for row in table_rows(table) if row[0] in run_ids]


def test_sweep_never_touches_non_terminal_runs(aged: RunProjection) -> None:
    aged.sweep_retention(datetime(9999, 1, 1, tzinfo=UTC))
    remaining = {run.id for run in aged.list_runs()}
    # Everything terminal with a finish time is gone; the rest stays.
    assert remaining == {
        "terminal-unfinished",
        "running-old-finish",
        "canceling-old-finish",
        "blocked",
    }


def test_sweep_is_idempotent(aged: RunProjection, table_rows: Rows) -> None:
    aged.sweep_retention(CUTOFF)
    before = {table: table_rows(table) for table in ("relay_runs", *CHILD_TABLES)}

    assert aged.sweep_retention(CUTOFF) == []

    assert {table: table_rows(table) for table in ("relay_runs", *CHILD_TABLES)} == before


def test_sweep_of_empty_database(projection: RunProjection) -> None:
    assert projection.count_sweepable(CUTOFF) == 0
    assert projection.sweep_retention(CUTOFF) == []


def test_count_sweepable_is_a_dry_run_that_agrees_with_sweep(
    aged: RunProjection, table_rows: Rows
) -> None:
    cutoffs = [
        CUTOFF - timedelta(days=20),
        CUTOFF - timedelta(days=10),
        CUTOFF - timedelta(days=10) + timedelta(microseconds=1),
        CUTOFF,
        CUTOFF + timedelta(microseconds=1),
        CUTOFF + timedelta(days=2),
    ]
    total = 0
    for cutoff in cutoffs:
        before = table_rows("relay_runs")
        count = aged.count_sweepable(cutoff)
        assert table_rows("relay_runs") == before  # counting deletes nothing
        deleted = aged.sweep_retention(cutoff)
        assert len(deleted) == count
        assert aged.count_sweepable(cutoff) == 0
        total += count
    assert total == 4  # old-completed, old-canceled, at-cutoff, new-completed


@pytest.fixture
def many_expired(projection: RunProjection) -> RunProjection:
    for index in range(7):
        run_id = f"x{index}"
        insert(projection, Seed(run_id, "repo", "wf", "K", RunState.STARTING, index))
        add_children(projection, run_id)
        projection.update_state(run_id, RunState.COMPLETED, finished_at=T0 + timedelta(hours=index))
    insert(projection, Seed("live", "repo", "wf", "K", RunState.RUNNING, 0))
    add_children(projection, "live")
    return projection


@pytest.fixture
def commits(observed_engine: Engine) -> Iterator[list[int]]:
    seen: list[int] = []

    def on_commit(conn: object) -> None:
        seen.append(1)

    sa.event.listen(observed_engine, "commit", on_commit)
    yield seen
    sa.event.remove(observed_engine, "commit", on_commit)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 6, 7, 8, 1000])
def test_sweep_in_batches_deletes_everything(
    many_expired: RunProjection, table_rows: Rows, commits: list[int], batch_size: int
) -> None:
    cutoff = T0 + timedelta(days=1)
    assert many_expired.count_sweepable(cutoff) == 7

    # A target no batch here can reach: batches of exactly batch_size runs.
    deleted = many_expired.sweep_retention(cutoff, batch_size=batch_size, target_batch_seconds=3600)

    assert sorted(deleted) == [f"x{index}" for index in range(7)]
    assert [run.id for run in many_expired.list_runs()] == ["live"]
    assert child_run_ids(table_rows) == {table: {"live"} for table in CHILD_TABLES}
    assert many_expired.count_sweepable(cutoff) == 0
    # One transaction per batch of at most batch_size runs (plus, at most, one
    # last transaction that finds nothing left).
    batches = math.ceil(7 / batch_size)
    assert batches <= len(commits) <= batches + 1
