"""Bad input, table-driven, on SQLite and PostgreSQL.

Refused input raises ``ValueError`` naming the argument and leaves all five
tables exactly as they were; hostile but legal text (SQL fragments, quote and
placeholder soup, a megabyte of Unicode) is stored and read back verbatim.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    ExecutorIdentity,
    InvalidIdentity,
    NodeRuntime,
    NodeSessionRegistration,
    RetryStatus,
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
)

Rows = Callable[[str], list[tuple[object, ...]]]
Call = Callable[[RunProjection], object]

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)
ALL_TABLES = (
    "relay_executor_identity",
    "relay_runs",
    "relay_node_runtime",
    "relay_node_sessions",
    "relay_processed_reports",
)
NUL = "bad\x00value"


def start(run_id: str = "r1", **text: str) -> RunStart:
    fields = {"repo": "repo", "workflow": "wf", "ticket_id": "T", "ticket_key": "K"}
    fields.update(text)
    return RunStart(
        id=run_id,
        repo=fields["repo"],
        workflow=fields["workflow"],
        ticket_id=fields["ticket_id"],
        ticket_key=fields["ticket_key"],
        logical_id=fields.get("logical_id", ""),
    )


def runtime(
    run_id: str = "r1",
    node: str = "build",
    terminal: str | None = "t",
    session: str | None = "s",
    visit: str | None = "v1",
) -> NodeRuntime:
    return NodeRuntime(run_id, node, terminal, session, visit)


def snapshot(table_rows: Rows) -> dict[str, list[tuple[object, ...]]]:
    return {table: table_rows(table) for table in ALL_TABLES}


@pytest.fixture
def seeded(projection: RunProjection) -> RunProjection:
    """One row in every table, so that "unchanged" means something everywhere."""
    projection.initialize_identity(ExecutorIdentity("goworkflows"))
    projection.insert_start(start(), T0)
    projection.update_retry("r1", RetryStatus(1, "flaky", T0))
    projection.update_node("r1", RunState.RUNNING, "build", "v1")
    projection.update_node_runtime(runtime())
    assert projection.register_node_session(NodeSessionRegistration("r1", "build", "s1"))
    projection.record_processed_report("r1", "v1", "rep-1")
    return projection


def case(name: str, call: Call, argument: str) -> object:
    return pytest.param(call, argument, id=name)


# --------------------------------------------------------- empty required ids ---

EMPTY_IDS = [
    case("insert_start-id", lambda p: p.insert_start(start(""), T0), "run id"),
    case("update_state-run", lambda p: p.update_state("", RunState.RUNNING), "run_id"),
    case("update_retry-run", lambda p: p.update_retry("", None), "run_id"),
    case("update_node-run", lambda p: p.update_node("", "running", "n", "v"), "run_id"),
    case("update_node-node", lambda p: p.update_node("r1", "running", "", "v"), "node"),
    case("update_node-visit", lambda p: p.update_node("r1", "running", "n", ""), "visit_id"),
    case("update_node_runtime-run", lambda p: p.update_node_runtime(runtime(run_id="")), "run_id"),
    case("update_node_runtime-node", lambda p: p.update_node_runtime(runtime(node="")), "node"),
    case(
        "update_node_runtime-visit",
        lambda p: p.update_node_runtime(runtime(visit="")),
        "node_visit_id",
    ),
    case(
        "update_node_runtime-visit-none",
        lambda p: p.update_node_runtime(runtime(visit=None)),
        "node_visit_id",
    ),
    case(
        "update_node_runtime-empty-binding",
        lambda p: p.update_node_runtime(p.load_node_runtime("r1", "fresh")),
        "node_visit_id",
    ),
    case("visit-run", lambda p: p.update_node_runtime_visit("", "build", "v2"), "run_id"),
    case("visit-node", lambda p: p.update_node_runtime_visit("r1", "", "v2"), "node"),
    case("visit-visit", lambda p: p.update_node_runtime_visit("r1", "build", ""), "visit_id"),
    case(
        "replace-run", lambda p: p.replace_node_runtime("", "build", "v1", "t", "s", "x"), "run_id"
    ),
    case("replace-node", lambda p: p.replace_node_runtime("r1", "", "v1", "t", "s", "x"), "node"),
    case(
        "replace-visit",
        lambda p: p.replace_node_runtime("r1", "build", "", "t", "s", "x"),
        "visit_id",
    ),
    case(
        "clear-run",
        lambda p: p.clear_node_runtime("", "build", clear_terminal=True, clear_session=True),
        "run_id",
    ),
    case(
        "clear-node",
        lambda p: p.clear_node_runtime("r1", "", clear_terminal=True, clear_session=True),
        "node",
    ),
    case(
        "register-run",
        lambda p: p.register_node_session(NodeSessionRegistration("", "build", "s2")),
        "run_id",
    ),
    case(
        "register-node",
        lambda p: p.register_node_session(NodeSessionRegistration("r1", "", "s2")),
        "node",
    ),
    case(
        "register-session",
        lambda p: p.register_node_session(NodeSessionRegistration("r1", "build", "")),
        "session_id",
    ),
    case("report-run", lambda p: p.record_processed_report("", "v1", "rep-2"), "run_id"),
    case("report-visit", lambda p: p.record_processed_report("r1", "", "rep-2"), "visit_id"),
    case("report-report", lambda p: p.record_processed_report("r1", "v1", ""), "report_id"),
]


@pytest.mark.parametrize(("call", "argument"), EMPTY_IDS)
def test_empty_required_id_is_refused(
    seeded: RunProjection, table_rows: Rows, call: Call, argument: str
) -> None:
    before = snapshot(table_rows)
    with pytest.raises(ValueError, match=rf"^{re.escape(argument)} .*empty"):
        call(seeded)
    assert snapshot(table_rows) == before


# ---------------------------------------------------------------- NUL bytes ---

NUL_WRITES = [
    case("insert_start-id", lambda p: p.insert_start(start(NUL), T0), "run id"),
    case("insert_start-repo", lambda p: p.insert_start(start("n", repo=NUL), T0), "repo"),
    case(
        "insert_start-workflow", lambda p: p.insert_start(start("n", workflow=NUL), T0), "workflow"
    ),
    case(
        "insert_start-ticket_id",
        lambda p: p.insert_start(start("n", ticket_id=NUL), T0),
        "ticket_id",
    ),
    case(
        "insert_start-ticket_key",
        lambda p: p.insert_start(start("n", ticket_key=NUL), T0),
        "ticket_key",
    ),
    case(
        "insert_start-logical_id",
        lambda p: p.insert_start(start("n", logical_id=NUL), T0),
        "logical_id",
    ),
    case("update_state-run", lambda p: p.update_state(NUL, RunState.RUNNING), "run_id"),
    case("update_state-error", lambda p: p.update_state("r1", RunState.RUNNING, NUL), "last_error"),
    case("update_retry-run", lambda p: p.update_retry(NUL, None), "run_id"),
    case(
        "update_retry-error",
        lambda p: p.update_retry("r1", RetryStatus(2, NUL, T0)),
        "retry last_error",
    ),
    case("update_node-run", lambda p: p.update_node(NUL, "running", "n", "v"), "run_id"),
    case("update_node-node", lambda p: p.update_node("r1", "running", NUL, "v"), "node"),
    case("update_node-visit", lambda p: p.update_node("r1", "running", "n", NUL), "visit_id"),
    case("runtime-run", lambda p: p.update_node_runtime(runtime(run_id=NUL)), "run_id"),
    case("runtime-node", lambda p: p.update_node_runtime(runtime(node=NUL)), "node"),
    case("runtime-terminal", lambda p: p.update_node_runtime(runtime(terminal=NUL)), "terminal_id"),
    case("runtime-session", lambda p: p.update_node_runtime(runtime(session=NUL)), "session_id"),
    case("runtime-visit", lambda p: p.update_node_runtime(runtime(visit=NUL)), "node_visit_id"),
    case("visit-run", lambda p: p.update_node_runtime_visit(NUL, "build", "v2"), "run_id"),
    case("visit-node", lambda p: p.update_node_runtime_visit("r1", NUL, "v2"), "node"),
    case("visit-visit", lambda p: p.update_node_runtime_visit("r1", "build", NUL), "visit_id"),
    case(
        "replace-run", lambda p: p.replace_node_runtime(NUL, "build", "v1", "t", "s", "x"), "run_id"
    ),
    case("replace-node", lambda p: p.replace_node_runtime("r1", NUL, "v1", "t", "s", "x"), "node"),
    case(
        "replace-visit",
        lambda p: p.replace_node_runtime("r1", "build", NUL, "t", "s", "x"),
        "visit_id",
    ),
    case(
        "replace-terminal",
        lambda p: p.replace_node_runtime("r1", "build", "v1", NUL, "s", "x"),
        "terminal_id",
    ),
    case(
        "replace-previous",
        lambda p: p.replace_node_runtime("r1", "build", "v1", "t", NUL, "x"),
        "previous_session_id",
    ),
    case(
        "replace-session",
        lambda p: p.replace_node_runtime("r1", "build", "v1", "t", "s", NUL),
        "session_id",
    ),
    case(
        "clear-run",
        lambda p: p.clear_node_runtime(NUL, "build", clear_terminal=True, clear_session=True),
        "run_id",
    ),
    case(
        "clear-node",
        lambda p: p.clear_node_runtime("r1", NUL, clear_terminal=True, clear_session=True),
        "node",
    ),
    case(
        "register-run",
        lambda p: p.register_node_session(NodeSessionRegistration(NUL, "build", "s2")),
        "run_id",
    ),
    case(
        "register-node",
        lambda p: p.register_node_session(NodeSessionRegistration("r1", NUL, "s2")),
        "node",
    ),
    case(
        "register-session",
        lambda p: p.register_node_session(NodeSessionRegistration("r1", "build", NUL)),
        "session_id",
    ),
    case("report-run", lambda p: p.record_processed_report(NUL, "v1", "rep-2"), "run_id"),
    case("report-visit", lambda p: p.record_processed_report("r1", NUL, "rep-2"), "visit_id"),
    case("report-report", lambda p: p.record_processed_report("r1", "v1", NUL), "report_id"),
]

NUL_READS = [
    case("get_run", lambda p: p.get_run(NUL), "run_id"),
    case("find_run_by_ticket", lambda p: p.find_run_by_ticket(NUL), "ticket_key"),
    case("find_run_by_logical_id", lambda p: p.find_run_by_logical_id(NUL), "logical_id"),
    case("list_runs-repo", lambda p: p.list_runs(RunFilter(repo=NUL)), "repo"),
    case("list_runs-workflow", lambda p: p.list_runs(RunFilter(workflow=NUL)), "workflow"),
    case("list_runs-ticket", lambda p: p.list_runs(RunFilter(ticket=NUL)), "ticket"),
    case("iter_runs-repo", lambda p: p.iter_runs(RunFilter(repo=NUL)), "repo"),
    case("count_runs-ticket", lambda p: p.count_runs(RunFilter(ticket=NUL)), "ticket"),
    case("has_active_workflow", lambda p: p.has_active_workflow(NUL), "workflow"),
    case("has_active_repo", lambda p: p.has_active_repo(NUL), "repo"),
    case("get_node_runtime-run", lambda p: p.get_node_runtime(NUL, "build"), "run_id"),
    case("get_node_runtime-node", lambda p: p.get_node_runtime("r1", NUL), "node"),
    case("load_node_runtime-node", lambda p: p.load_node_runtime("r1", NUL), "node"),
    case("is_current-run", lambda p: p.node_runtime_visit_is_current(NUL, "b", "v"), "run_id"),
    case("is_current-node", lambda p: p.node_runtime_visit_is_current("r1", NUL, "v"), "node"),
    case("is_current-visit", lambda p: p.node_runtime_visit_is_current("r1", "b", NUL), "visit_id"),
    case("list_node_runtimes", lambda p: p.list_node_runtimes(NUL), "run_id"),
    case("has_processed_report-run", lambda p: p.has_processed_report(NUL, "rep-1"), "run_id"),
    case("has_processed_report-report", lambda p: p.has_processed_report("r1", NUL), "report_id"),
]


@pytest.mark.parametrize(("call", "argument"), NUL_WRITES + NUL_READS)
def test_nul_is_refused_naming_the_argument(
    seeded: RunProjection, table_rows: Rows, call: Call, argument: str
) -> None:
    before = snapshot(table_rows)
    with pytest.raises(ValueError, match=rf"^{re.escape(argument)} .*NUL") as info:
        call(seeded)
    assert type(info.value) is ValueError  # not a driver error dressed up
    assert snapshot(table_rows) == before


@pytest.mark.parametrize(
    ("identity", "argument"),
    [
        (ExecutorIdentity("temporal", NUL, "ns"), "temporal_address"),
        (ExecutorIdentity("temporal", "host:7233", NUL), "temporal_namespace"),
        (ExecutorIdentity("temporal\x00"), "executor_plugin"),
        (ExecutorIdentity("temporal", "host\ud800", "ns"), "temporal_address"),
        (ExecutorIdentity("temporal", "host:7233", "\udfff"), "temporal_namespace"),
        (ExecutorIdentity("go\ud800"), "executor_plugin"),
        (ExecutorIdentity("temporal", 7233, "ns"), "temporal_address"),  # type: ignore[arg-type]
    ],
    ids=["address", "namespace", "plugin", "surrogate-address", "surrogate-namespace",
         "surrogate-plugin", "not-text"],
)  # fmt: skip
def test_unstorable_identity_text_is_refused(
    projection: RunProjection, table_rows: Rows, identity: ExecutorIdentity, argument: str
) -> None:
    with pytest.raises(InvalidIdentity, match=argument):
        projection.initialize_identity(identity)
    with pytest.raises(InvalidIdentity, match=argument):
        projection.verify_identity(identity)
    assert table_rows("relay_executor_identity") == []


# ------------------------------------------------------- numbers and states ---

NUMBERS = [
    case("attempt_id-negative", lambda p: p.insert_start(_attempt(-1), T0), "attempt_id"),
    case("attempt_id-too-large", lambda p: p.insert_start(_attempt(2**31), T0), "attempt_id"),
    case(
        "retry-attempt-negative",
        lambda p: p.update_retry("r1", RetryStatus(-1, "e", T0)),
        "retry attempt",
    ),
    case(
        "retry-attempt-too-large",
        lambda p: p.update_retry("r1", RetryStatus(2**31, "e", T0)),
        "retry attempt",
    ),
    case("iter_runs-batch-negative", lambda p: p.iter_runs(batch_size=-1), "batch_size"),
    case("iter_runs-batch-zero", lambda p: p.iter_runs(batch_size=0), "batch_size"),
    case(
        "sweep-batch-negative",
        lambda p: p.sweep_retention(T0 + timedelta(days=1), batch_size=-1),
        "batch_size",
    ),
    case(
        "sweep-batch-zero",
        lambda p: p.sweep_retention(T0 + timedelta(days=1), batch_size=0),
        "batch_size",
    ),
    case("list_runs-limit-negative", lambda p: p.list_runs(limit=-1), "limit"),
]


def _attempt(attempt_id: int) -> RunStart:
    return RunStart("new", "repo", "wf", "T", "K", attempt_id=attempt_id)


@pytest.mark.parametrize(("call", "argument"), NUMBERS)
def test_bad_numbers_are_refused(
    seeded: RunProjection, table_rows: Rows, call: Call, argument: str
) -> None:
    seeded.update_state("r1", RunState.COMPLETED, finished_at=T0)  # sweepable
    before = snapshot(table_rows)
    with pytest.raises(ValueError, match=rf"^{re.escape(argument)} "):
        call(seeded)
    assert snapshot(table_rows) == before


STATES = [
    case("update_state", lambda p: p.update_state("r1", "exploded"), "state"),
    case("update_state-case", lambda p: p.update_state("r1", "RUNNING"), "state"),
    case("update_state-empty", lambda p: p.update_state("r1", ""), "state"),
    case("update_node", lambda p: p.update_node("r1", "paused", "build", "v2"), "state"),
]


@pytest.mark.parametrize(("call", "argument"), STATES)
def test_unknown_state_is_refused(
    seeded: RunProjection, table_rows: Rows, call: Call, argument: str
) -> None:
    before = snapshot(table_rows)
    with pytest.raises(ValueError, match=r"unknown run state"):
        call(seeded)
    assert snapshot(table_rows) == before


# ---------------------------------------------------- hostile but legal text ---

NASTY = [
    pytest.param("x'); DROP TABLE relay_runs; --", id="drop-table"),
    pytest.param("' OR '1'='1", id="or-true"),
    pytest.param("'; DELETE FROM relay_node_runtime WHERE '1'='1", id="delete"),
    pytest.param('%s %(run)s :run ? $1 \\ \\\\ " ` ; /* */ -- %%', id="placeholders"),
    pytest.param("ünïcødé 🙂 \u2028 \t\n\r ' \"", id="unicode"),
]


@pytest.mark.parametrize("text", NASTY)
def test_hostile_text_is_stored_verbatim(
    projection: RunProjection, engine: Engine, table_rows: Rows, text: str
) -> None:
    def v(tag: str) -> str:
        return f"{text}|{tag}"

    run_id = v("id")
    projection.insert_start(
        RunStart(run_id, v("repo"), v("wf"), v("tid"), v("tkey"), logical_id=v("lid")), T0
    )
    projection.update_retry(run_id, RetryStatus(1, v("retry"), T0))
    projection.update_node(run_id, RunState.RUNNING, v("node"), v("visit"))
    projection.update_state(run_id, RunState.RUNNING, v("error"))

    run = projection.get_run(run_id)
    assert (run.id, run.logical_id, run.repo, run.workflow) == (
        run_id,
        v("lid"),
        v("repo"),
        v("wf"),
    )
    assert (run.ticket_id, run.ticket_key) == (v("tid"), v("tkey"))
    assert (run.current_node, run.current_node_visit_id) == (v("node"), v("visit"))
    assert run.last_error == v("error")
    assert run.retry == RetryStatus(1, v("retry"), T0)
    assert projection.find_run_by_ticket(v("tkey")) == run
    assert projection.find_run_by_logical_id(v("lid")) == run
    wanted = RunFilter(repo=v("repo"), workflow=v("wf"), ticket=v("tkey"), active=True)
    assert projection.list_runs(wanted) == [run]
    assert list(projection.iter_runs(wanted, batch_size=1)) == [run]
    assert projection.count_runs(wanted) == {RunState.RUNNING: 1}
    assert projection.has_active_workflow(v("wf"))
    assert projection.has_active_repo(v("repo"))
    assert projection.list_runs(RunFilter(repo=text)) == []

    projection.update_node_runtime(NodeRuntime(run_id, v("n2"), v("term"), v("sess"), v("vis2")))
    assert projection.node_runtime_visit_is_current(run_id, v("n2"), v("vis2"))
    projection.replace_node_runtime(run_id, v("n2"), v("vis2"), v("term3"), v("sess"), v("sess3"))
    stored = projection.get_node_runtime(run_id, v("n2"))
    assert (stored.terminal_id, stored.session_id, stored.node_visit_id) == (
        v("term3"),
        v("sess3"),
        v("vis2"),
    )
    assert projection.register_node_session(NodeSessionRegistration(run_id, v("node"), v("ses")))
    assert projection.get_node_runtime(run_id, v("node")).session_id == v("ses")
    assert [rt.node for rt in projection.list_node_runtimes(run_id)] == sorted([v("node"), v("n2")])
    projection.clear_node_runtime(run_id, v("n2"), clear_terminal=True, clear_session=False)
    assert projection.get_node_runtime(run_id, v("n2")).terminal_id is None

    projection.record_processed_report(run_id, v("visit"), v("report"))
    assert projection.has_processed_report(run_id, v("report"))
    assert not projection.has_processed_report(run_id, text)

    identity = ExecutorIdentity("temporal", v("address"), v("namespace"))
    projection.initialize_identity(identity)
    assert projection.identity() == identity
    projection.verify_identity(identity)

    # Every table is still there, holding exactly the rows written above.
    assert set(ALL_TABLES) <= set(sa.inspect(engine).get_table_names())
    counts = {table: len(table_rows(table)) for table in ALL_TABLES}
    assert counts == {
        "relay_executor_identity": 1,
        "relay_runs": 1,
        "relay_node_runtime": 2,
        "relay_node_sessions": 1,
        "relay_processed_reports": 1,
    }

    projection.update_state(run_id, RunState.COMPLETED, finished_at=T0)
    assert projection.sweep_retention(T0 + timedelta(seconds=1)) == [run_id]
    assert all(table_rows(table) == [] for table in ALL_TABLES[1:])


def megabyte(seed: int) -> str:
    """One million characters of mixed-width Unicode (1-4 UTF-8 bytes each), reproducible."""
    alphabet = "abcXYZ 019'\";-\\%\n\té€中𝄞🙂"
    return "".join(random.Random(seed).choices(alphabet, k=1_000_000))


def test_megabyte_strings_are_stored_verbatim(projection: RunProjection) -> None:
    # Free text (never a key, never compared): an index entry cannot hold a
    # megabyte on PostgreSQL, nor a MySQL TEXT more than 64 KiB.
    big = [megabyte(seed) for seed in range(5)]
    projection.insert_start(start(), T0)
    projection.update_state("r1", RunState.RUNNING, big[0])
    projection.update_retry("r1", RetryStatus(1, big[1], T0))
    projection.update_node_runtime(NodeRuntime("r1", "build", big[2], "s-1", "v-1"))
    identity = ExecutorIdentity("temporal", big[3], big[4])
    projection.initialize_identity(identity)

    run = projection.get_run("r1")
    assert run.last_error == big[0]
    assert run.retry is not None
    assert run.retry.last_error == big[1]
    stored = projection.get_node_runtime("r1", "build")
    assert (stored.terminal_id, stored.session_id, stored.node_visit_id) == (big[2], "s-1", "v-1")
    assert projection.identity() == identity
    projection.verify_identity(identity)


KEY_LIMIT_CASES: list[tuple[str, Callable[[RunProjection, str], object]]] = [
    ("run id", lambda p, v: p.insert_start(RunStart(v, "repo", "wf", "T", "K"), T0)),
    ("repo", lambda p, v: p.insert_start(RunStart("r9", v, "wf", "T", "K"), T0)),
    ("workflow", lambda p, v: p.insert_start(RunStart("r9", "repo", v, "T", "K"), T0)),
    ("ticket_key", lambda p, v: p.insert_start(RunStart("r9", "repo", "wf", "T", v), T0)),
    ("logical_id", lambda p, v: p.insert_start(RunStart("r9", "repo", "wf", "T", "K", v), T0)),
    ("node", lambda p, v: p.update_node("r1", RunState.RUNNING, v, "visit")),
    ("session_id", lambda p, v: p.register_node_session(NodeSessionRegistration("r1", "n", v))),
    ("visit_id", lambda p, v: p.update_node("r1", RunState.RUNNING, "n", v)),
    ("ticket_id", lambda p, v: p.insert_start(RunStart("r9", "repo", "wf", v, "K"), T0)),
    ("report_id", lambda p, v: p.record_processed_report("r1", "visit", v)),
]


@pytest.mark.parametrize(("name", "call"), KEY_LIMIT_CASES, ids=[c[0] for c in KEY_LIMIT_CASES])
def test_identifiers_over_512_bytes_are_refused_alike(
    projection: RunProjection,
    table_rows: Rows,
    name: str,
    call: Callable[[RunProjection, str], object],
) -> None:
    """Identifiers are capped at 512 UTF-8 bytes on every database (PostgreSQL's
    B-tree entries cannot hold more than ~2.7 kB, MySQL stores VARBINARY(512),
    and a key holds up to three of them)."""
    projection.insert_start(start(), T0)
    projection.update_node("r1", RunState.RUNNING, "n", "visit")
    before = {table: table_rows(table) for table in ALL_TABLES}
    with pytest.raises(ValueError, match=rf"^{re.escape(name)} is 513 bytes"):
        call(projection, "é" * 256 + "x")  # 513 bytes, 257 characters
    assert {table: table_rows(table) for table in ALL_TABLES} == before
    call(projection, "é" * 256)  # exactly 512 bytes is accepted


# ------------------------------------------- lone surrogates, filters, cursors ---

# A lone surrogate has no UTF-8 form: the drivers raised a raw UnicodeEncodeError.
# The catalogue (tests/reliability) tries every text argument on the sync facade;
# these run a sample of writes and reads on every facade.
# High and low halves alike ("\udcff" is what surrogateescape leaves of byte 0xff).
SURROGATES = [pytest.param("ab\ud800", id="high"), pytest.param("ab\udcff-tail", id="low")]
SURROGATE_CASES: list[tuple[str, Callable[[RunProjection, str], object]]] = [
    ("run id", lambda p, v: p.insert_start(start(v), T0)),
    ("ticket_id", lambda p, v: p.insert_start(start("r9", ticket_id=v), T0)),
    ("last_error", lambda p, v: p.update_state("r1", RunState.BLOCKED, v)),
    ("visit_id", lambda p, v: p.update_node("r1", RunState.RUNNING, "build", v)),
    ("previous_session_id", lambda p, v: p.replace_node_runtime("r1", "build", "v1", "t", v, "s")),
    ("session_id", lambda p, v: p.register_node_session(NodeSessionRegistration("r1", "build", v))),
    ("workflow", lambda p, v: list(p.iter_runs(RunFilter(workflow=v)))),
    ("report_id", lambda p, v: p.has_processed_report("r1", v)),
]


@pytest.mark.parametrize("text", SURROGATES)
@pytest.mark.parametrize(
    ("argument", "call"),
    SURROGATE_CASES,
    ids=[f"{i}-{c[0]}" for i, c in enumerate(SURROGATE_CASES)],
)
def test_lone_surrogate_is_refused_naming_the_argument(
    seeded: RunProjection,
    table_rows: Rows,
    argument: str,
    call: Callable[[RunProjection, str], object],
    text: str,
) -> None:
    before = snapshot(table_rows)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(argument)} .*lone surrogate at index 2"
    ) as info:
        call(seeded, text)
    assert type(info.value) is ValueError  # not UnicodeEncodeError, a ValueError subclass
    assert snapshot(table_rows) == before


def test_valid_non_ascii_text_is_still_accepted(seeded: RunProjection) -> None:
    """The surrogate check refuses only halves: astral characters (one code point each
    in a Python str) and other non-ASCII text are stored as before."""
    text = "日本語 🚀 \U0001f600 ü"
    seeded.insert_start(start("r9", repo=text, ticket_id=text), T0)
    run = seeded.get_run("r9")
    assert (run.repo, run.ticket_id) == (text, text)
    assert [r.id for r in seeded.list_runs(RunFilter(repo=text))] == ["r9"]


READERS: list[tuple[str, Callable[[RunProjection, RunFilter], object]]] = [
    ("list_runs", lambda p, f: p.list_runs(f)),
    ("iter_runs", lambda p, f: list(p.iter_runs(f))),
    ("count_runs", lambda p, f: p.count_runs(f)),
]


@pytest.mark.parametrize("active", ["false", 0], ids=["str-false", "zero"])
@pytest.mark.parametrize(("name", "read"), READERS, ids=[n for n, _ in READERS])
def test_run_filter_active_must_be_a_bool(
    seeded: RunProjection,
    name: str,
    read: Callable[[RunProjection, RunFilter], object],
    active: object,
) -> None:
    """RunFilter(active="false") is truthy: it used to list the *active* runs."""
    with pytest.raises(TypeError, match=r"^active must be a bool or None"):
        read(seeded, RunFilter(active=active))  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "read"), READERS, ids=[n for n, _ in READERS])
def test_filter_must_be_a_run_filter(
    seeded: RunProjection, name: str, read: Callable[[RunProjection, RunFilter], object]
) -> None:
    with pytest.raises(TypeError, match=r"^filter must be a RunFilter or None, not dict"):
        read(seeded, {"repo": "repo"})  # type: ignore[arg-type]


def test_keyset_cursor_must_be_a_run_with_aware_times(seeded: RunProjection) -> None:
    run = seeded.get_run("r1")
    with pytest.raises(TypeError, match=r"^after must be a Run or None, not str"):
        seeded.list_runs(after="r1")  # type: ignore[arg-type]
    naive = replace(run, started_at=run.started_at.replace(tzinfo=None))
    with pytest.raises(ValueError, match=r"^after\.started_at must be timezone-aware"):
        seeded.list_runs(after=naive)
    with pytest.raises(TypeError, match=r"^after\.started_at must be a datetime, not NoneType"):
        seeded.list_runs(after=replace(run, started_at=None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^after\.id .*lone surrogate"):
        seeded.list_runs(after=replace(run, id="r\ud800"))
    # A cursor in another zone is the same instant: paging is unchanged.
    seeded.insert_start(start("r2"), T0 + timedelta(seconds=1))
    shifted = replace(run, started_at=run.started_at.astimezone(timezone(timedelta(hours=-7))))
    assert [r.id for r in seeded.list_runs(after=shifted)] == ["r2"]
