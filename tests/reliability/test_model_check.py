"""Model check: random sequences of every repository operation against an in-memory model.

A Hypothesis RuleBasedStateMachine drives the real RunProjection (on SQLite
and on PostgreSQL) and reliability_model.Model side by side: every result and
every exception type must agree, the run list is compared after each step,
and the whole state (runs, node runtimes, session and receipt rows with their
visits and creation times, identity marker) at the end of each example.
Identifiers are drawn from small pools, so writes to unknown runs, revisits,
stale visits, ties in started_at and re-registrations happen often; they
include SQL-injection text and non-ASCII characters, which must be stored
verbatim. Examples: 100 x RELAY_RELIABILITY_SCALE per database, up to 50 steps each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from reliability_model import Clock, Model
from reliability_support import scaled
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    ExecutorIdentity,
    NodeRuntime,
    NodeSessionRegistration,
    RetryStatus,
    Run,
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
    create_engine,
)
from relay_flow_projection import statements as sql
from relay_flow_projection.schema import node_runtime, node_sessions, processed_reports

BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
STEPS = 50

RUN_IDS = ["r1", "R2", "é3", "x'); DROP TABLE relay_runs; --"]
NODES = ["build", "Zeta"]  # "Zeta" sorts first: byte order on both databases
VISITS = ["v1", "v2"]
SESSIONS = ["s1", "s2"]
REPORTS = ["rep1", "rep2"]

run_ids = st.sampled_from(RUN_IDS)
nodes = st.sampled_from(NODES)
visits = st.sampled_from(VISITS)
sessions = st.sampled_from(SESSIONS)
reports = st.sampled_from(REPORTS)
repos = st.sampled_from(["", "repo-a", "repo-b"])
workflows = st.sampled_from(["", "wf-a", "wf-b"])
tickets = st.sampled_from(["", "T-1", "T-2"])
states = st.sampled_from(list(RunState)) | st.sampled_from([s.value for s in RunState])
optional_text = st.sampled_from([None, "", "boom", "it's; DELETE FROM relay_runs"])
optional_sessions = st.sampled_from([None, "", *SESSIONS])
zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
instants = st.builds(
    lambda seconds, micros, zone: (
        BASE + timedelta(seconds=seconds, microseconds=micros)
    ).astimezone(zone),
    st.integers(0, 8),
    st.sampled_from([0, 1, 500000, 999999]),
    zones,
)
filters = st.builds(
    RunFilter,
    repo=st.none() | repos,
    workflow=st.none() | workflows,
    ticket=st.none() | tickets,
    active=st.none() | st.booleans(),
)
identities = st.sampled_from(
    [
        ExecutorIdentity("goworkflows"),
        ExecutorIdentity("temporal", "temporal:7233", "ns-a"),
        ExecutorIdentity("temporal", "temporal:7233", "ns-b"),
    ]
)
starts = st.builds(
    RunStart,
    id=run_ids,
    repo=repos,
    workflow=workflows,
    ticket_id=tickets,
    ticket_key=tickets,
    logical_id=st.sampled_from(["", "L1", "r1"]),
    attempt_id=st.integers(0, 3),
)


RUN_READS = [
    "get_run",
    "find_run_by_ticket",
    "find_run_by_logical_id",
    "list_runs",
    "iter_runs",
    "count_runs",
    "has_active_workflow",
    "has_active_repo",
    "count_sweepable",
]
BINDING_READS = [
    "get_node_runtime",
    "load_node_runtime",
    "node_runtime_visit_is_current",
    "list_node_runtimes",
    "has_processed_report",
    "identity",
]


def _keyset_run(run_id: str, started_at: datetime) -> Run:
    """A Run standing for a page boundary: list_runs(after=) uses only started_at and id."""
    return Run(
        run_id, run_id, 1, "", "", "", "", RunState.RUNNING, None, None, None, None,
        started_at, started_at, None,
    )  # fmt: skip


def _assert_utc(value: Any) -> None:
    """API.md: every timestamp that comes out is in UTC."""
    if isinstance(value, datetime):
        assert value.tzinfo is UTC, value
    elif is_dataclass(value) and not isinstance(value, type):
        for field in fields(value):
            _assert_utc(getattr(value, field.name))
    elif isinstance(value, list | tuple):
        for item in value:
            _assert_utc(item)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # compared by type with the model's outcome
        return "error", exc


def _compare(real: Callable[[], Any], model: Callable[[], Any], *, choices: bool = False) -> Any:
    """Run both; same value (or, with *choices*, one of the model's values) or same error type."""
    got, expected = _outcome(real), _outcome(model)
    if got[0] == "error" or expected[0] == "error":
        assert type(got[1]) is type(expected[1]), f"real {got!r}, model {expected!r}"
        return None
    _assert_utc(got[1])
    if choices:
        assert got[1] in expected[1], f"real {got[1]!r} not among {expected[1]!r}"
    else:
        assert got[1] == expected[1]
    return got[1]


class Counters:
    examples = 0
    steps = 0


def _clear(engine: Engine) -> None:
    """A clean database for the next example (DELETE beats TRUNCATE on tables this small)."""
    with engine.begin() as connection:
        for table in (
            "relay_node_sessions",
            "relay_processed_reports",
            "relay_node_runtime",
            "relay_runs",
            "relay_executor_identity",
        ):
            connection.exec_driver_sql(f"DELETE FROM {table}")


def machine_for(engine: Engine, counters: Counters) -> type[RuleBasedStateMachine]:
    class ProjectionMachine(RuleBasedStateMachine):
        """Writes are one rule each; reads are grouped into two rules that pick an
        operation, so that write sequences (retry, then a terminal state; a report,
        then a sweep) are not diluted among many read rules."""

        started = Bundle("started")

        def __init__(self) -> None:
            super().__init__()
            _clear(engine)
            self.clock = Clock(BASE + timedelta(seconds=4))
            self.real = RunProjection(engine, clock=self.clock)
            self.model = Model(self.clock)
            counters.examples += 1

        def both(self, name: str, *args: Any, choices: bool = False, **kwargs: Any) -> Any:
            counters.steps += 1
            self.clock.advance(timedelta(milliseconds=1))  # every write stamps a new instant
            return _compare(
                lambda: getattr(self.real, name)(*args, **kwargs),
                lambda: getattr(self.model, name)(*args, **kwargs),
                choices=choices,
            )

        @initialize(
            target=started,
            batch=st.lists(
                st.tuples(starts, instants, nodes, visits, optional_sessions),
                min_size=1,
                max_size=3,
            ),
        )
        def some_runs(self, batch: list[tuple[RunStart, datetime, str, str, str | None]]) -> Any:
            """Start each example with runs that already have a bound node, often a session."""
            for start, now, node, visit, session in batch:
                self.both("insert_start", start, now)
                self.both("update_node", start.id, RunState.RUNNING, node, visit)
                if session:
                    self.both(
                        "register_node_session", NodeSessionRegistration(start.id, node, session)
                    )
            return multiple(*(start.id for start, *_ in batch))

        # ------------------------------------------------------ time ---

        @rule(seconds=st.integers(0, 3), micros=st.sampled_from([0, 1, 250000]))
        def advance_clock(self, seconds: int, micros: int) -> None:
            self.clock.advance(timedelta(seconds=seconds, microseconds=micros))

        # ----------------------------------------------------- writes ---

        @rule(target=started, start=starts, now=instants)
        def insert_start(self, start: RunStart, now: datetime) -> str:
            self.both("insert_start", start, now)
            return start.id

        @rule(
            run_id=started | run_ids,
            state=states,
            last_error=optional_text,
            finished_at=st.none() | instants,
        )
        def update_state(
            self, run_id: str, state: str, last_error: str | None, finished_at: datetime | None
        ) -> None:
            self.both("update_state", run_id, state, last_error, finished_at)

        @rule(
            run_id=started | run_ids,
            status=st.none()
            | st.builds(RetryStatus, st.integers(0, 5), st.sampled_from(["", "flaky"]), instants),
        )
        def update_retry(self, run_id: str, status: RetryStatus | None) -> None:
            self.both("update_retry", run_id, status)

        @rule(run_id=started | run_ids, state=states, node=nodes, visit=visits)
        def update_node(self, run_id: str, state: str, node: str, visit: str) -> None:
            self.both("update_node", run_id, state, node, visit)

        @rule(older_than=instants, batch_size=st.integers(1, 3))
        def sweep_retention(self, older_than: datetime, batch_size: int) -> None:
            counters.steps += 1
            _compare(
                lambda: sorted(self.real.sweep_retention(older_than, batch_size=batch_size)),
                lambda: sorted(self.model.sweep_retention(older_than, batch_size=batch_size)),
            )

        @rule(
            run_id=started | run_ids,
            node=nodes,
            terminal=optional_text,
            session=optional_sessions,
            visit=visits,
        )
        def update_node_runtime(
            self, run_id: str, node: str, terminal: str | None, session: str | None, visit: str
        ) -> None:
            self.both("update_node_runtime", NodeRuntime(run_id, node, terminal, session, visit))

        @rule(run_id=started | run_ids, node=nodes, visit=visits)
        def update_node_runtime_visit(self, run_id: str, node: str, visit: str) -> None:
            self.both("update_node_runtime_visit", run_id, node, visit)

        @rule(
            run_id=started | run_ids,
            node=nodes,
            visit=visits,
            terminal=optional_text,
            previous=optional_sessions,
            session=optional_sessions,
        )
        def replace_node_runtime(
            self,
            run_id: str,
            node: str,
            visit: str,
            terminal: str | None,
            previous: str | None,
            session: str | None,
        ) -> None:
            self.both("replace_node_runtime", run_id, node, visit, terminal, previous, session)

        @rule(
            run_id=started | run_ids,
            node=nodes,
            clear_terminal=st.booleans(),
            clear_session=st.booleans(),
        )
        def clear_node_runtime(
            self, run_id: str, node: str, clear_terminal: bool, clear_session: bool
        ) -> None:
            self.both(
                "clear_node_runtime",
                run_id,
                node,
                clear_terminal=clear_terminal,
                clear_session=clear_session,
            )

        @rule(run_id=started | run_ids, node=nodes, session=sessions)
        def register_node_session(self, run_id: str, node: str, session: str) -> None:
            self.both("register_node_session", NodeSessionRegistration(run_id, node, session))

        @rule(run_id=started | run_ids, visit=visits, report=reports)
        def record_processed_report(self, run_id: str, visit: str, report: str) -> None:
            self.both("record_processed_report", run_id, visit, report)

        @rule(identity=identities)
        def initialize_identity(self, identity: ExecutorIdentity) -> None:
            self.both("initialize_identity", identity)

        @rule(identity=identities)
        def verify_identity(self, identity: ExecutorIdentity) -> None:
            self.both("verify_identity", identity)

        # ------------------------------------------------------ reads ---

        @rule(data=st.data(), run_id=started | run_ids)
        def read_runs(self, data: st.DataObject, run_id: str) -> None:
            operation = data.draw(st.sampled_from(RUN_READS), label="operation")
            if operation == "get_run":
                self.both("get_run", run_id)
            elif operation == "find_run_by_ticket":
                self.both("find_run_by_ticket", data.draw(tickets), choices=True)
            elif operation == "find_run_by_logical_id":
                logical = data.draw(st.sampled_from(["L1", run_id, "nope"]))
                self.both("find_run_by_logical_id", logical, choices=True)
            elif operation == "list_runs":
                after = data.draw(st.none() | st.builds(_keyset_run, st.just(run_id), instants))
                limit = data.draw(st.none() | st.integers(0, 4))
                self.both("list_runs", data.draw(st.none() | filters), limit=limit, after=after)
            elif operation == "iter_runs":
                wanted = data.draw(st.none() | filters)
                size = data.draw(st.integers(1, 4))
                counters.steps += 1
                _compare(
                    lambda: list(self.real.iter_runs(wanted, batch_size=size)),
                    lambda: self.model.list_runs(wanted),
                )
            elif operation == "count_runs":
                self.both("count_runs", data.draw(st.none() | filters))
            elif operation == "has_active_workflow":
                self.both("has_active_workflow", data.draw(workflows))
            elif operation == "has_active_repo":
                self.both("has_active_repo", data.draw(repos))
            else:
                self.both("count_sweepable", data.draw(instants))

        @rule(data=st.data(), run_id=started | run_ids, node=nodes)
        def read_bindings(self, data: st.DataObject, run_id: str, node: str) -> None:
            operation = data.draw(st.sampled_from(BINDING_READS), label="operation")
            if operation in ("get_node_runtime", "load_node_runtime"):
                self.both(operation, run_id, node)
            elif operation == "node_runtime_visit_is_current":
                self.both(operation, run_id, node, data.draw(visits))
            elif operation == "list_node_runtimes":
                self.both(operation, run_id)
            elif operation == "has_processed_report":
                self.both(operation, run_id, data.draw(reports))
            else:
                self.both("identity")

        # ------------------------------------------------ the state ---

        def assert_same_state(self) -> None:
            assert self.real.list_runs() == self.model.list_runs()
            assert self.real.identity() == self.model.identity()
            with engine.connect() as connection:
                stored_runtimes = {
                    (row.run_id, row.node): sql.row_to_node_runtime(row)
                    for row in connection.execute(sa.select(node_runtime))
                }
                stored_sessions = {
                    (row.run_id, row.node, row.session_id): (row.node_visit_id, row.created_at)
                    for row in connection.execute(sa.select(node_sessions))
                }
                stored_reports = {
                    (row.run_id, row.report_id): (row.node_visit_id, row.created_at)
                    for row in connection.execute(sa.select(processed_reports))
                }
            assert stored_runtimes == self.model.runtimes
            assert stored_sessions == self.model.sessions
            assert stored_reports == self.model.reports

        @invariant()
        def same_state(self) -> None:
            self.assert_same_state()

        def teardown(self) -> None:
            self.assert_same_state()
            for run_id in RUN_IDS:
                assert self.real.list_node_runtimes(run_id) == self.model.list_node_runtimes(run_id)

    return ProjectionMachine


@pytest.fixture
def model_engine(migrated_url: str, dialect: str) -> Iterator[Engine]:
    target = migrated_url
    if dialect == "postgresql":
        # Semantics, not durability, are under test: skip the fsync of each commit.
        url = sa.make_url(migrated_url)
        options = f"{url.query.get('options', '')} -csynchronous_commit=off".strip()
        target = url.update_query_dict({"options": options}).render_as_string(hide_password=False)
    engine = create_engine(target)
    yield engine
    engine.dispose()


def test_repository_matches_the_model(model_engine: Engine, dialect: str) -> None:
    counters = Counters()
    examples = scaled(100)
    run_state_machine_as_test(
        machine_for(model_engine, counters),
        settings=settings(
            max_examples=examples,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    print(
        f"\nmodel check[{dialect}]: {counters.examples} examples tried "
        f"(max_examples={examples}, up to {STEPS} steps each), "
        f"{counters.steps} operations compared with the model, 0 differences"
    )
