"""Bad input, catalogued: one table of everything a caller can get wrong, on both databases.

Each entry is one wrong call and what must happen:

- ``Refused``: a clear error of API.md (``ValueError``/``TypeError`` for a bad
  argument, naming it; ``InvalidIdentity``; ``NotAProjectionDatabase``,
  ``SchemaOutOfDate`` or ``ProjectionError`` naming the target), never a
  driver exception, and the database is exactly as before;
- ``Answered``: a read with hostile text returns its ordinary answer (not
  found, empty, False) and changes nothing;
- ``Stored``: hostile but legal text (SQL injection, 1 MB of free text,
  extreme timestamps) is stored and read back verbatim.

Categories: naive and far-out-of-range datetimes, ``datetime`` subclasses with
their own ``isoformat`` (stored canonically), unknown states, empty ids, huge
strings, NUL bytes, lone surrogates and SQL-injection text in every text
argument, mistyped ``RunFilter`` fields and keyset cursors, negative or mistyped
numbers, and bad targets (a directory, an unwritable
path, a file that is not a database, a truncated database, a database
written by a newer release). The seeded database is reset before each entry.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa
from fakes import IST, OwnText, as_subclass
from reliability_support import snapshot
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    ExecutorIdentity,
    InvalidIdentity,
    NodeRuntime,
    NodeRuntimeNotFound,
    NodeSessionRegistration,
    NotAProjectionDatabase,
    ProjectionError,
    RetryStatus,
    Run,
    RunFilter,
    RunNotFound,
    RunProjection,
    RunStart,
    RunState,
    SchemaOutOfDate,
    create_engine,
    has_nonterminal_runs,
    init_database,
    init_database_with_identity,
    open_projection,
    upgrade,
)
from relay_flow_projection.schema import metadata as schema_metadata

T0 = datetime(2026, 2, 1, 8, 30, 0, 654321, tzinfo=UTC)
NUL = "bad\x00value"
INJECTION = "x'); DROP TABLE relay_runs; --"
HUGE = "ü" * 500_000  # 1 MB of UTF-8
LONE_SURROGATE = "bad\ud800value"  # no UTF-8 form: what a badly decoded byte string leaves
NAIVE = datetime(2026, 2, 1, 8, 30)
TOO_EARLY = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))  # before year 1 in UTC
TOO_LATE = datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=5)))  # after 9999
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)
BOTH = ("sqlite", "postgresql", "mysql")  # every database


P = RunProjection


@dataclass
class Ctx:
    dialect: str
    url: str
    engine: Engine
    projection: RunProjection
    tmp_path: Path = Path()
    new_schema: Callable[[], str] = str


# ------------------------------------------------------------ expectations ---


@dataclass(frozen=True)
class Refused:
    error: type[BaseException]
    match: str


@dataclass(frozen=True)
class Answered:
    value: Any


@dataclass(frozen=True)
class Stored:
    check: Callable[[Ctx, str], bool]


@dataclass(frozen=True)
class Entry:
    category: str
    name: str
    call: Callable[[Ctx, Any], Any]
    expect: Refused | Answered | Stored
    dialects: tuple[str, ...] = BOTH
    target: str = "seeded"  # or one of TARGETS: the call gets that target as 2nd argument
    setup: Callable[[P, str], Any] | None = None
    payload: str = ""


def start(run_id: str = "n1", **fields: Any) -> RunStart:
    values: dict[str, Any] = {
        "repo": "repo",
        "workflow": "wf",
        "ticket_id": "T",
        "ticket_key": "K",
        "logical_id": "",
    }
    values.update(fields)
    return RunStart(run_id, **values)


def seed(p: P) -> None:
    """A row in every table but the identity marker (its own entries write one)."""
    p.insert_start(start("r1"), T0)
    p.update_retry("r1", RetryStatus(1, "flaky", T0))
    p.update_node("r1", RunState.RUNNING, "build", "v1")
    p.update_node_runtime(NodeRuntime("r1", "build", "t1", None, "v1"))
    assert p.register_node_session(NodeSessionRegistration("r1", "build", "s1"))
    p.record_processed_report("r1", "v1", "rep-1")
    p.insert_start(start("r2"), T0)
    p.update_state("r2", RunState.COMPLETED, None, T0)  # sweepable


# ------------------------------------------------------- text arguments ---


@dataclass(frozen=True)
class TextArgument:
    """One text argument of one operation, and how to see what was stored in it."""

    operation: str
    name: str  # as error messages name it
    call: Callable[[P, str], Any]
    key: bool  # identifiers are capped at 512 bytes; free text is not
    required: bool = True
    setup: Callable[[P, str], Any] | None = None
    stored: Callable[[Ctx, str], bool] | None = None  # None: a read


def _new_run(p: P, v: str) -> None:
    p.insert_start(start(v), T0)


def _new_run_at(node: str, visit: str) -> Callable[[P, str], None]:
    def setup(p: P, v: str) -> None:
        p.insert_start(start(v), T0)
        p.update_node(v, RunState.RUNNING, node, visit)

    return setup


def _new_run_with_runtime(p: P, v: str) -> None:
    p.insert_start(start(v), T0)
    p.update_node_runtime(NodeRuntime(v, "build", "t", "s", "v1"))


def _runtime(ctx: Ctx, run_id: str, node: str) -> NodeRuntime:
    return ctx.projection.get_node_runtime(run_id, node)


def _report_visit(ctx: Ctx, report_id: str) -> str:
    reports = schema_metadata.tables["relay_processed_reports"]
    with ctx.engine.connect() as connection:
        return str(
            connection.execute(
                sa.select(reports.c.node_visit_id).where(
                    reports.c.run_id == "r1", reports.c.report_id == report_id
                )
            ).scalar_one()
        )


WRITES = [
    TextArgument(
        "insert_start", "run id", lambda p, v: p.insert_start(start(v), T0), key=True,
        stored=lambda c, v: c.projection.get_run(v).id == v,
    ),
    TextArgument(
        "insert_start", "repo", lambda p, v: p.insert_start(start(repo=v), T0), key=True,
        required=False, stored=lambda c, v: c.projection.get_run("n1").repo == v,
    ),
    TextArgument(
        "insert_start", "workflow", lambda p, v: p.insert_start(start(workflow=v), T0), key=True,
        required=False, stored=lambda c, v: c.projection.get_run("n1").workflow == v,
    ),
    TextArgument(
        "insert_start", "ticket_id", lambda p, v: p.insert_start(start(ticket_id=v), T0),
        key=True, required=False, stored=lambda c, v: c.projection.get_run("n1").ticket_id == v,
    ),
    TextArgument(
        "insert_start", "ticket_key", lambda p, v: p.insert_start(start(ticket_key=v), T0),
        key=True, required=False,
        stored=lambda c, v: c.projection.find_run_by_ticket(v).id == "n1",
    ),
    TextArgument(
        "insert_start", "logical_id", lambda p, v: p.insert_start(start(logical_id=v), T0),
        key=True, required=False,
        stored=lambda c, v: c.projection.find_run_by_logical_id(v).id == "n1",
    ),
    TextArgument(
        "update_state", "run_id", lambda p, v: p.update_state(v, "blocked"), key=True,
        setup=_new_run, stored=lambda c, v: c.projection.get_run(v).state == "blocked",
    ),
    TextArgument(
        "update_state", "last_error", lambda p, v: p.update_state("r1", "blocked", v), key=False,
        required=False, stored=lambda c, v: c.projection.get_run("r1").last_error == v,
    ),
    TextArgument(
        "update_retry", "run_id", lambda p, v: p.update_retry(v, RetryStatus(3, "e", T0)),
        key=True, setup=_new_run,
        stored=lambda c, v: c.projection.get_run(v).retry == RetryStatus(3, "e", T0),
    ),
    TextArgument(
        "update_retry", "retry last_error",
        lambda p, v: p.update_retry("r1", RetryStatus(2, v, T0)), key=False, required=False,
        stored=lambda c, v: c.projection.get_run("r1").retry == RetryStatus(2, v, T0),
    ),
    TextArgument(
        "update_node", "run_id", lambda p, v: p.update_node(v, "running", "n", "v9"), key=True,
        setup=_new_run, stored=lambda c, v: _runtime(c, v, "n").node_visit_id == "v9",
    ),
    TextArgument(
        "update_node", "node", lambda p, v: p.update_node("r1", "running", v, "v9"), key=True,
        stored=lambda c, v: c.projection.get_run("r1").current_node == v
        and _runtime(c, "r1", v).node_visit_id == "v9",
    ),
    TextArgument(
        "update_node", "visit_id", lambda p, v: p.update_node("r1", "running", "build", v),
        key=True,
        stored=lambda c, v: c.projection.get_run("r1").current_node_visit_id == v
        and _runtime(c, "r1", "build").node_visit_id == v,
    ),
    TextArgument(
        "update_node_runtime", "run_id",
        lambda p, v: p.update_node_runtime(NodeRuntime(v, "n", "t", "s", "v1")), key=True,
        setup=_new_run, stored=lambda c, v: _runtime(c, v, "n").terminal_id == "t",
    ),
    TextArgument(
        "update_node_runtime", "node",
        lambda p, v: p.update_node_runtime(NodeRuntime("r1", v, "t", "s", "v1")), key=True,
        stored=lambda c, v: _runtime(c, "r1", v).terminal_id == "t",
    ),
    TextArgument(
        "update_node_runtime", "terminal_id",
        lambda p, v: p.update_node_runtime(NodeRuntime("r1", "build", v, "s", "v1")), key=False,
        required=False, stored=lambda c, v: _runtime(c, "r1", "build").terminal_id == v,
    ),
    TextArgument(
        "update_node_runtime", "session_id",
        lambda p, v: p.update_node_runtime(NodeRuntime("r1", "build", "t", v, "v1")), key=True,
        required=False, stored=lambda c, v: _runtime(c, "r1", "build").session_id == v,
    ),
    TextArgument(
        "update_node_runtime", "node_visit_id",
        lambda p, v: p.update_node_runtime(NodeRuntime("r1", "build", "t", "s", v)), key=True,
        stored=lambda c, v: _runtime(c, "r1", "build").node_visit_id == v,
    ),
    TextArgument(
        "update_node_runtime_visit", "run_id",
        lambda p, v: p.update_node_runtime_visit(v, "n", "v2"), key=True, setup=_new_run,
        stored=lambda c, v: _runtime(c, v, "n").node_visit_id == "v2",
    ),
    TextArgument(
        "update_node_runtime_visit", "node",
        lambda p, v: p.update_node_runtime_visit("r1", v, "v2"), key=True,
        stored=lambda c, v: _runtime(c, "r1", v).node_visit_id == "v2",
    ),
    TextArgument(
        "update_node_runtime_visit", "visit_id",
        lambda p, v: p.update_node_runtime_visit("r1", "build", v), key=True,
        stored=lambda c, v: _runtime(c, "r1", "build").node_visit_id == v,
    ),
    TextArgument(
        "replace_node_runtime", "run_id",
        lambda p, v: p.replace_node_runtime(v, "build", "v1", "t2", None, "s2"), key=True,
        setup=_new_run_at("build", "v1"),
        stored=lambda c, v: _runtime(c, v, "build").session_id == "s2",
    ),
    TextArgument(
        "replace_node_runtime", "node",
        lambda p, v: p.replace_node_runtime("r1", v, "vq", "t2", None, "s2"), key=True,
        setup=lambda p, v: p.update_node("r1", "running", v, "vq"),
        stored=lambda c, v: _runtime(c, "r1", v).session_id == "s2",
    ),
    TextArgument(
        "replace_node_runtime", "visit_id",
        lambda p, v: p.replace_node_runtime("r1", "build", v, "t2", "s1", "s2"), key=True,
        setup=lambda p, v: p.update_node("r1", "running", "build", v),
        stored=lambda c, v: _runtime(c, "r1", "build").session_id == "s2",
    ),
    TextArgument(
        "replace_node_runtime", "terminal_id",
        lambda p, v: p.replace_node_runtime("r1", "build", "v1", v, "s1", "s2"), key=False,
        required=False, stored=lambda c, v: _runtime(c, "r1", "build").terminal_id == v,
    ),
    TextArgument(
        "replace_node_runtime", "previous_session_id",
        lambda p, v: p.replace_node_runtime("r1", "build", "v1", "t2", v, "s2"), key=True,
        required=False,
        setup=lambda p, v: p.update_node_runtime(NodeRuntime("r1", "build", "t", v, "v1")),
        stored=lambda c, v: _runtime(c, "r1", "build").session_id == "s2",
    ),
    TextArgument(
        "replace_node_runtime", "session_id",
        lambda p, v: p.replace_node_runtime("r1", "build", "v1", "t2", "s1", v), key=True,
        required=False, stored=lambda c, v: _runtime(c, "r1", "build").session_id == v,
    ),
    TextArgument(
        "clear_node_runtime", "run_id",
        lambda p, v: p.clear_node_runtime(v, "build", clear_terminal=True, clear_session=False),
        key=True,
        setup=_new_run_with_runtime,
        stored=lambda c, v: _runtime(c, v, "build").terminal_id is None,
    ),
    TextArgument(
        "clear_node_runtime", "node",
        lambda p, v: p.clear_node_runtime("r1", v, clear_terminal=True, clear_session=False),
        key=True,
        setup=lambda p, v: p.update_node_runtime(NodeRuntime("r1", v, "t", "s", "v1")),
        stored=lambda c, v: _runtime(c, "r1", v).terminal_id is None,
    ),
    TextArgument(
        "register_node_session", "run_id",
        lambda p, v: p.register_node_session(NodeSessionRegistration(v, "n", "s5")), key=True,
        setup=_new_run_at("n", "v1"), stored=lambda c, v: _runtime(c, v, "n").session_id == "s5",
    ),
    TextArgument(
        "register_node_session", "node",
        lambda p, v: p.register_node_session(NodeSessionRegistration("r1", v, "s5")), key=True,
        setup=lambda p, v: p.update_node("r1", "running", v, "v7"),
        stored=lambda c, v: _runtime(c, "r1", v).session_id == "s5",
    ),
    TextArgument(
        "register_node_session", "session_id",
        lambda p, v: p.register_node_session(NodeSessionRegistration("r1", "build", v)), key=True,
        stored=lambda c, v: _runtime(c, "r1", "build").session_id == v,
    ),
    TextArgument(
        "record_processed_report", "run_id",
        lambda p, v: p.record_processed_report(v, "v1", "rep-5"), key=True, setup=_new_run,
        stored=lambda c, v: c.projection.has_processed_report(v, "rep-5"),
    ),
    TextArgument(
        "record_processed_report", "visit_id",
        lambda p, v: p.record_processed_report("r1", v, "rep-5"), key=True,
        stored=lambda c, v: _report_visit(c, "rep-5") == v,
    ),
    TextArgument(
        "record_processed_report", "report_id",
        lambda p, v: p.record_processed_report("r1", "v1", v), key=True,
        stored=lambda c, v: c.projection.has_processed_report("r1", v),
    ),
]  # fmt: skip

READS = [
    TextArgument("get_run", "run_id", lambda p, v: p.get_run(v), key=True),
    TextArgument("find_run_by_ticket", "ticket_key", lambda p, v: p.find_run_by_ticket(v), True),
    TextArgument(
        "find_run_by_logical_id", "logical_id", lambda p, v: p.find_run_by_logical_id(v), True
    ),
    TextArgument("list_runs", "repo", lambda p, v: p.list_runs(RunFilter(repo=v)), True),
    TextArgument("list_runs", "workflow", lambda p, v: p.list_runs(RunFilter(workflow=v)), True),
    TextArgument("list_runs", "ticket", lambda p, v: p.list_runs(RunFilter(ticket=v)), True),
    TextArgument("iter_runs", "repo", lambda p, v: list(p.iter_runs(RunFilter(repo=v))), True),
    TextArgument(
        "iter_runs", "workflow", lambda p, v: list(p.iter_runs(RunFilter(workflow=v))), True
    ),
    TextArgument("iter_runs", "ticket", lambda p, v: list(p.iter_runs(RunFilter(ticket=v))), True),
    TextArgument("count_runs", "repo", lambda p, v: p.count_runs(RunFilter(repo=v)), True),
    TextArgument("count_runs", "workflow", lambda p, v: p.count_runs(RunFilter(workflow=v)), True),
    TextArgument("count_runs", "ticket", lambda p, v: p.count_runs(RunFilter(ticket=v)), True),
    TextArgument("has_active_workflow", "workflow", lambda p, v: p.has_active_workflow(v), True),
    TextArgument("has_active_repo", "repo", lambda p, v: p.has_active_repo(v), True),
    TextArgument("get_node_runtime", "run_id", lambda p, v: p.get_node_runtime(v, "build"), True),
    TextArgument("get_node_runtime", "node", lambda p, v: p.get_node_runtime("r1", v), True),
    TextArgument("load_node_runtime", "node", lambda p, v: p.load_node_runtime("r1", v), True),
    TextArgument(
        "node_runtime_visit_is_current", "run_id",
        lambda p, v: p.node_runtime_visit_is_current(v, "build", "v1"), True,
    ),
    TextArgument(
        "node_runtime_visit_is_current", "node",
        lambda p, v: p.node_runtime_visit_is_current("r1", v, "v1"), True,
    ),
    TextArgument(
        "node_runtime_visit_is_current", "visit_id",
        lambda p, v: p.node_runtime_visit_is_current("r1", "build", v), True,
    ),
    TextArgument("list_node_runtimes", "run_id", lambda p, v: p.list_node_runtimes(v), True),
    TextArgument(
        "has_processed_report", "run_id", lambda p, v: p.has_processed_report(v, "rep-1"), True
    ),
    TextArgument(
        "has_processed_report", "report_id", lambda p, v: p.has_processed_report("r1", v), True
    ),
]  # fmt: skip

# What a read answers when nothing matches its (hostile) argument.
NOT_FOUND: dict[str, Any] = {
    "get_run": Refused(RunNotFound, "not found"),
    "find_run_by_ticket": Refused(RunNotFound, "not found"),
    "find_run_by_logical_id": Refused(RunNotFound, "not found"),
    "list_runs": Answered([]),
    "iter_runs": Answered([]),
    "count_runs": Answered({}),
    "has_active_workflow": Answered(False),
    "has_active_repo": Answered(False),
    "get_node_runtime": Refused(NodeRuntimeNotFound, "no runtime binding"),
    "node_runtime_visit_is_current": Answered(False),
    "list_node_runtimes": Answered([]),
    "has_processed_report": Answered(False),
}


def _apply(argument: TextArgument) -> Callable[[Ctx, Any], Any]:
    return lambda ctx, payload: argument.call(ctx.projection, payload)


def _text_entries() -> Iterator[Entry]:
    for argument in WRITES + READS:
        label = f"{argument.operation}-{argument.name.replace(' ', '_')}"
        call = _apply(argument)
        yield Entry(
            "NUL byte", label, call, Refused(ValueError, rf"^{argument.name} .*NUL"), payload=NUL
        )
        surrogate = Refused(ValueError, rf"^{argument.name} .*lone surrogate at index 3")
        yield Entry("lone surrogate", label, call, surrogate, payload=LONE_SURROGATE)
        if argument.stored is not None:
            verbatim = Stored(argument.stored)
            yield Entry(
                "SQL injection", label, call, verbatim, setup=argument.setup, payload=INJECTION
            )
            if argument.key:
                huge: Refused | Stored = Refused(ValueError, rf"^{argument.name} .*512 bytes")
            else:
                huge = verbatim
            yield Entry("1 MB string", label, call, huge, setup=argument.setup, payload=HUGE)
            if argument.required:
                yield Entry(
                    "empty id", label, call, Refused(ValueError, rf"^{argument.name} .*empty")
                )
        else:
            if argument.operation == "load_node_runtime":
                answer: Refused | Answered = Answered(NodeRuntime("r1", INJECTION))
            else:
                answer = NOT_FOUND[argument.operation]
            yield Entry("SQL injection", label, call, answer, payload=INJECTION)
            if argument.key:
                yield Entry(
                    "1 MB string",
                    label,
                    call,
                    Refused(ValueError, rf"^{argument.name} .*512 bytes"),
                    payload=HUGE,
                )
            else:
                yield Entry("1 MB string", label, call, NOT_FOUND[argument.operation], payload=HUGE)


# -------------------------------------------------------------- identity ---


def _identity_entries() -> Iterator[Entry]:
    def initialize(identity: ExecutorIdentity) -> Callable[[Ctx, Any], Any]:
        return lambda ctx, _: ctx.projection.initialize_identity(identity)

    def verify(identity: ExecutorIdentity) -> Callable[[Ctx, Any], Any]:
        return lambda ctx, _: ctx.projection.verify_identity(identity)

    def stored(identity: ExecutorIdentity) -> Stored:
        return Stored(lambda ctx, _: ctx.projection.identity() == identity)

    bad = {
        "plugin-NUL": (ExecutorIdentity("temporal\x00", "host:7233", "ns"), "executor_plugin"),
        "plugin-unknown": (ExecutorIdentity("zeebe"), "unknown executor plugin"),
        "plugin-injection": (ExecutorIdentity(INJECTION), "unknown executor plugin"),
        "plugin-huge": (ExecutorIdentity(HUGE), "unknown executor plugin"),
        "address-NUL": (ExecutorIdentity("temporal", NUL, "ns"), "temporal_address"),
        "namespace-NUL": (ExecutorIdentity("temporal", "host:7233", NUL), "temporal_namespace"),
        "temporal-blank": (ExecutorIdentity("temporal", " ", "ns"), "non-blank"),
        "goworkflows-with-address": (ExecutorIdentity("goworkflows", "host:7233"), "must not"),
    }
    for label, (identity, message) in bad.items():
        refused = Refused(InvalidIdentity, message)
        yield Entry("identity", f"initialize_identity-{label}", initialize(identity), refused)
        yield Entry("identity", f"verify_identity-{label}", verify(identity), refused)
    for label, payload in (("injection", INJECTION), ("huge", HUGE)):
        for part in ("address", "namespace"):
            identity = (
                ExecutorIdentity("temporal", payload, "ns")
                if part == "address"
                else ExecutorIdentity("temporal", "host:7233", payload)
            )
            yield Entry(
                "identity",
                f"initialize_identity-{part}-{label}",
                initialize(identity),
                stored(identity),
            )


# ---------------------------------------------------- datetimes, states, numbers ---


def _naive_clock(ctx: Ctx, _: Any) -> None:
    RunProjection(ctx.engine, clock=lambda: NAIVE).update_state("r1", "blocked")


def _started(value: datetime) -> Callable[[Ctx, Any], Any]:
    return lambda ctx, _: ctx.projection.insert_start(start(), value)


def _started_at(value: datetime) -> Callable[[Ctx, str], bool]:
    return lambda ctx, _: ctx.projection.get_run("n1").started_at == value


def _finished(value: datetime) -> Callable[[Ctx, Any], Any]:
    return lambda ctx, _: ctx.projection.update_state("r1", "completed", None, value)


def _finished_at(value: datetime) -> Callable[[Ctx, str], bool]:
    return lambda ctx, _: ctx.projection.get_run("r1").finished_at == value


def _set_state(state: Any) -> Callable[[Ctx, Any], Any]:
    return lambda ctx, _: ctx.projection.update_state("r1", state)


def _set_node_state(state: Any) -> Callable[[Ctx, Any], Any]:
    return lambda ctx, _: ctx.projection.update_node("r1", state, "build", "v2")


def _value_entries() -> Iterator[Entry]:
    def p(call: Callable[[P], Any]) -> Callable[[Ctx, Any], Any]:
        return lambda ctx, _: call(ctx.projection)

    timestamps: dict[str, tuple[str, Callable[[datetime], Callable[[P], Any]]]] = {
        "insert_start-now": ("now", lambda d: lambda q: q.insert_start(start(), d)),
        "update_state-finished_at": (
            "finished_at",
            lambda d: lambda q: q.update_state("r1", "completed", None, d),
        ),
        "update_retry-next_retry_at": (
            "next_retry_at",
            lambda d: lambda q: q.update_retry("r1", RetryStatus(2, "e", d)),
        ),
        "sweep_retention-older_than": ("older_than", lambda d: lambda q: q.sweep_retention(d)),
        "count_sweepable-older_than": ("older_than", lambda d: lambda q: q.count_sweepable(d)),
    }
    for label, (name, make) in timestamps.items():
        for kind, value, message in (
            ("naive", NAIVE, "must be timezone-aware"),
            ("before-year-1", TOO_EARLY, "outside the representable range"),
            ("after-year-9999", TOO_LATE, "outside the representable range"),
        ):
            refused = Refused(ValueError, f"^{name} .*{message}")
            yield Entry("datetime", f"{label}-{kind}", p(make(value)), refused)
        yield Entry(
            "datetime",
            f"{label}-not-a-datetime",
            p(make("2026-02-01T08:30:00Z")),  # type: ignore[arg-type]
            Refused(TypeError, f"^{name} must be a datetime"),
        )
    yield Entry("datetime", "clock-naive", _naive_clock, Refused(ValueError, r"^clock\(\) .*aware"))
    for label, value in (("earliest", EARLIEST), ("latest", LATEST)):
        yield Entry(
            "datetime", f"insert_start-now-{label}", _started(value), Stored(_started_at(value))
        )
        yield Entry(
            "datetime",
            f"update_state-finished_at-{label}",
            _finished(value),
            Stored(_finished_at(value)),
        )
    unknown = Refused(ValueError, "^unknown run state")
    for label, state in (
        ("exploded", "exploded"),
        ("wrong-case", "RUNNING"),
        ("empty", ""),
        ("none", None),
        ("injection", INJECTION),
    ):
        yield Entry("state", f"update_state-{label}", _set_state(state), unknown)
        yield Entry("state", f"update_node-{label}", _set_node_state(state), unknown)
    numbers: dict[str, tuple[Callable[[P], Any], type[BaseException], str]] = {
        "attempt_id-negative": (
            lambda q: q.insert_start(start(attempt_id=-1), T0), ValueError, "^attempt_id .*negative"
        ),
        "attempt_id-too-large": (
            lambda q: q.insert_start(start(attempt_id=2**31), T0), ValueError, "^attempt_id .*most"
        ),
        "attempt_id-str": (
            lambda q: q.insert_start(start(attempt_id="1"), T0), TypeError, "^attempt_id .*int"
        ),
        "retry-attempt-negative": (
            lambda q: q.update_retry("r1", RetryStatus(-1, "e", T0)), ValueError, "^retry attempt"
        ),
        "iter_runs-batch_size-zero": (
            lambda q: q.iter_runs(batch_size=0), ValueError, "^batch_size .*positive"
        ),
        "iter_runs-batch_size-negative": (
            lambda q: q.iter_runs(batch_size=-5), ValueError, "^batch_size .*negative"
        ),
        "sweep_retention-batch_size-zero": (
            lambda q: q.sweep_retention(T0 + timedelta(days=1), batch_size=0),
            ValueError,
            "^batch_size .*positive",
        ),
        "sweep_retention-batch_size-negative": (
            lambda q: q.sweep_retention(T0 + timedelta(days=1), batch_size=-1),
            ValueError,
            "^batch_size .*negative",
        ),
        "sweep_retention-batch_size-float": (
            lambda q: q.sweep_retention(T0 + timedelta(days=1), batch_size=cast(int, 2.5)),
            TypeError,
            "^batch_size .*int",
        ),
        "list_runs-limit-negative": (
            lambda q: q.list_runs(limit=-1), ValueError, "^limit .*negative"
        ),
    }  # fmt: skip
    for label, (call, error, message) in numbers.items():
        yield Entry("number", label, p(call), Refused(error, message))


# ------------------------------------------- datetime subclasses (canonical) ---

CANONICAL_T0 = "2026-02-01 08:30:00.654321+00:00"  # the SQLite layout (timestamps.py)


def _stored_text(ctx: Ctx, column: str, run_id: str) -> Any:
    with ctx.engine.connect() as connection:
        return connection.exec_driver_sql(
            f"SELECT {column} FROM relay_runs WHERE id = '{run_id}'"  # fixed names only
        ).scalar_one()


def _canonically(column: str, run_id: str, read: Callable[[Run], Any]) -> Stored:
    """Read back equal to T0 as a plain datetime, in SQLite's layout, and every listing works."""

    def check(ctx: Ctx, _: str) -> bool:
        value = read(ctx.projection.get_run(run_id))
        listed = [run.id for run in ctx.projection.list_runs()]
        paged = [run.id for run in ctx.projection.iter_runs(batch_size=1)]
        stored_ok = ctx.dialect != "sqlite" or _stored_text(ctx, column, run_id) == CANONICAL_T0
        return value == T0 and type(value) is datetime and listed == paged and stored_ok

    return Stored(check)


def _subclass_clock(ctx: Ctx, _: Any) -> None:
    RunProjection(ctx.engine, clock=lambda: as_subclass(OwnText, T0.astimezone(IST))).update_state(
        "r1", "blocked"
    )


def _with(value: Any, call: Callable[[P, Any], Any]) -> Callable[[Ctx, Any], Any]:
    """*call* on the seeded projection with *value* (bound now, not when a loop ends)."""
    return lambda ctx, _: call(ctx.projection, value)


def _subclass_entries() -> Iterator[Entry]:
    for zone, when in (
        ("utc", as_subclass(OwnText, T0)),
        ("ist", as_subclass(OwnText, T0.astimezone(IST))),
    ):
        writes: dict[str, tuple[Callable[[P, Any], Any], Stored]] = {
            "insert_start-now": (
                lambda q, d: q.insert_start(start(), d),
                _canonically("started_at", "n1", lambda r: r.started_at),
            ),
            "update_state-finished_at": (
                lambda q, d: q.update_state("r1", "completed", None, d),
                _canonically("finished_at", "r1", lambda r: r.finished_at),
            ),
            "update_retry-next_retry_at": (
                lambda q, d: q.update_retry("r1", RetryStatus(2, "e", d)),
                _canonically("next_retry_at", "r1", lambda r: r.retry and r.retry.next_retry_at),
            ),
        }
        for label, (call, stored) in writes.items():
            yield Entry("datetime subclass", f"{label}-{zone}", _with(when, call), stored)
        # Reads compare stored text with the bound cutoff/cursor on SQLite: the
        # subclass's own text ("around ...") sorts after every timestamp,
        # so a cutoff before the only finish would count it.
        earlier = as_subclass(OwnText, (T0 - timedelta(seconds=1)).astimezone(when.tzinfo))
        yield Entry(
            "datetime subclass",
            f"count_sweepable-older_than-{zone}",
            _with(earlier, lambda q, d: q.count_sweepable(d)),
            Answered(0),
        )
        yield Entry(
            "datetime subclass",
            f"list_runs-after-{zone}",
            _with(
                when,
                lambda q, d: [
                    r.id for r in q.list_runs(after=replace(q.get_run("r1"), started_at=d))
                ],
            ),
            Answered(["r2"]),
        )
    yield Entry(
        "datetime subclass",
        "clock",
        _subclass_clock,
        _canonically("updated_at", "r1", lambda r: r.updated_at),
    )


# ------------------------------------------------- RunFilter and keyset cursor ---


def _filter_and_cursor_entries() -> Iterator[Entry]:
    def p(call: Callable[[P], Any]) -> Callable[[Ctx, Any], Any]:
        return lambda ctx, _: call(ctx.projection)

    readers: dict[str, Callable[[P, Any], Any]] = {
        "list_runs": lambda q, f: [r.id for r in q.list_runs(f)],
        "iter_runs": lambda q, f: [r.id for r in q.iter_runs(f)],
        "count_runs": lambda q, f: q.count_runs(f),
    }
    # The seed has one active run (r1, running) and one terminal one (r2, completed).
    answers: dict[str, dict[bool, Any]] = {
        "list_runs": {True: ["r1"], False: ["r2"]},
        "iter_runs": {True: ["r1"], False: ["r2"]},
        "count_runs": {True: {RunState.RUNNING: 1}, False: {RunState.COMPLETED: 1}},
    }
    # A truthy non-bool would silently mean True: "false" listed the active runs.
    for operation, read in readers.items():
        for label, active in (
            ("str-false", "false"),
            ("int-0", 0),
            ("int-1", 1),
            ("empty-str", ""),
        ):
            yield Entry(
                "run filter",
                f"{operation}-active-{label}",
                _with(RunFilter(active=cast(Any, active)), read),
                Refused(TypeError, r"^active must be a bool or None, not (str|int)"),
            )
        yield Entry(
            "run filter",
            f"{operation}-filter-not-a-RunFilter",
            _with({"active": True}, read),
            Refused(TypeError, r"^filter must be a RunFilter or None, not dict"),
        )
        for active, answer in answers[operation].items():
            yield Entry(
                "run filter",
                f"{operation}-active-{active}",
                _with(RunFilter(active=active), read),
                Answered(answer),
            )

    def after(cursor: Callable[[P], Any]) -> Callable[[Ctx, Any], Any]:
        return p(lambda q: [r.id for r in q.list_runs(after=cursor(q))])

    def r1_with(**changes: Any) -> Callable[[P], Run]:
        return lambda q: replace(q.get_run("r1"), **changes)

    cursors: dict[str, tuple[Callable[[P], Any], Refused]] = {
        "str": (lambda q: "r1", Refused(TypeError, "^after must be a Run or None, not str")),
        "run-id-only": (
            lambda q: ("r1", T0), Refused(TypeError, "^after must be a Run or None, not tuple")
        ),
        "naive-started_at": (
            r1_with(started_at=T0.replace(tzinfo=None)),
            Refused(ValueError, "^after.started_at must be timezone-aware"),
        ),
        "str-started_at": (
            r1_with(started_at="2026-02-01T08:30:00Z"),
            Refused(TypeError, "^after.started_at must be a datetime, not str"),
        ),
        "out-of-range-started_at": (
            r1_with(started_at=TOO_EARLY),
            Refused(ValueError, "^after.started_at .*outside the representable range"),
        ),
        "int-id": (r1_with(id=1), Refused(TypeError, "^after.id must be a str, not int")),
        "NUL-id": (r1_with(id=NUL), Refused(ValueError, "^after.id must not contain NUL")),
        "surrogate-id": (r1_with(id=LONE_SURROGATE), Refused(ValueError, "^after.id .*surrogate")),
        "huge-id": (r1_with(id=HUGE), Refused(ValueError, "^after.id .*512 bytes")),
    }  # fmt: skip
    for label, (cursor, refused) in cursors.items():
        yield Entry("keyset cursor", f"list_runs-after-{label}", after(cursor), refused)
    for label, cursor, answer in (  # neighbours that are fine: answered as usual
        ("ist-started_at", r1_with(started_at=T0.astimezone(IST)), ["r2"]),
        ("injection-id", r1_with(id=INJECTION), []),  # "x'..." sorts after "r2"
    ):
        yield Entry("keyset cursor", f"list_runs-after-{label}", after(cursor), Answered(answer))


# ---------------------------------------------------------------- targets ---

TARGETS = ("directory", "unwritable", "inside-a-file", "not-a-database", "truncated", "newer")


def _make_target(kind: str, ctx: Ctx) -> str:
    """A bad target of *kind* (SQLite paths, or for "newer" a database of ctx's dialect)."""
    folder = ctx.tmp_path
    if kind == "directory":
        return str(folder)
    if kind == "unwritable":
        return "/proc/relay-flow.db"  # even root cannot create a file there
    if kind == "inside-a-file":
        (folder / "notes.txt").write_text("notes\n", encoding="utf-8")
        return str(folder / "notes.txt" / "relay.db")
    if kind == "not-a-database":
        (folder / "relay.db").write_text("relay-flow notes\n" * 200, encoding="utf-8")
        return str(folder / "relay.db")
    target = str(folder / "relay.db") if ctx.dialect == "sqlite" else ctx.new_schema()
    init_database(target)
    projection = open_projection(target)
    projection.insert_start(start("kept"), T0)
    projection.engine.dispose()
    engine = sa.create_engine(
        target if "://" in target else f"sqlite:///{target}", poolclass=NullPool
    )
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE alembic_version SET version_num = '9999_from_the_future'"
        )
    engine.dispose()
    if kind == "truncated":
        with open(target, "r+b") as handle:
            handle.truncate(os.path.getsize(target) // 2)
    return target


def _target_state(kind: str, target: str, ctx: Ctx) -> Any:
    """What must not change: the bytes and siblings of a file, or a schema's rows."""
    if "://" in target:
        engine = sa.create_engine(target, poolclass=NullPool)
        try:
            return snapshot(engine)
        finally:
            engine.dispose()
    path = Path(target)
    if kind == "directory":
        return sorted(os.listdir(path))
    if kind in ("unwritable", "inside-a-file"):  # nothing may appear, nothing may change
        notes = ctx.tmp_path / "notes.txt"
        return (
            path.exists(),
            sorted(os.listdir(ctx.tmp_path)),
            notes.exists() and notes.read_bytes(),
        )
    if kind == "newer":  # SQLite may add -wal/-shm beside it; the rows must stay
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return {
                table: connection.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                for table in ("relay_runs", "alembic_version")
            }
        finally:
            connection.close()
    return path.read_bytes(), sorted(os.listdir(path.parent))


TARGET_CALLS: dict[str, Callable[[str], Any]] = {
    "open_projection": lambda t: open_projection(t),
    "open_projection-upgrade": lambda t: open_projection(t, upgrade=True),
    "init_database": init_database,
    "upgrade": upgrade,
    "init_database_with_identity": lambda t: init_database_with_identity(
        t, ExecutorIdentity("goworkflows")
    ),
    "has_nonterminal_runs": has_nonterminal_runs,
    "create_engine": lambda t: create_engine(t).dispose(),
}
TARGET_ERRORS: dict[str, Refused] = {
    "directory": Refused(NotAProjectionDatabase, "is a directory"),
    "unwritable": Refused(ProjectionError, r"/proc/relay-flow\.db"),
    "inside-a-file": Refused(ProjectionError, r"notes\.txt/relay\.db.*Not a directory"),
    "not-a-database": Refused(NotAProjectionDatabase, r"relay\.db is not a SQLite database"),
    "truncated": Refused(NotAProjectionDatabase, r"relay\.db is a truncated or damaged"),
    "newer": Refused(SchemaOutOfDate, "9999_from_the_future.*newer release"),
}


def _on_target(function: Callable[[str], Any]) -> Callable[[Ctx, Any], Any]:
    return lambda ctx, target: function(target)


def _target_entries() -> Iterator[Entry]:
    for kind in TARGETS:
        for label, function in TARGET_CALLS.items():
            if kind == "newer" and label in ("has_nonterminal_runs", "create_engine"):
                continue  # they never look at the revision: a newer schema is fine for them
            expect = TARGET_ERRORS[kind]
            if kind == "unwritable" and label in ("open_projection", "has_nonterminal_runs"):
                expect = Refused(ProjectionError, r"/proc/relay-flow\.db does not exist")
            yield Entry(
                "target",
                f"{kind}-{label}",
                _on_target(function),
                expect,
                dialects=BOTH if kind == "newer" else ("sqlite",),
                target=kind,
            )


CATALOGUE = [
    *_text_entries(),
    *_identity_entries(),
    *_value_entries(),
    *_subclass_entries(),
    *_filter_and_cursor_entries(),
    *_target_entries(),
]
PARAMETERS = [
    pytest.param(dialect, entry, id=f"{dialect}-{entry.category.replace(' ', '_')}-{entry.name}")
    for entry in CATALOGUE
    for dialect in entry.dialects
]


# ----------------------------------------------------------------- the test ---


@dataclass
class Databases:
    """One seeded database per dialect for the whole module, reset before each entry."""

    tmp: Path
    schemas: Any
    mysql: Any
    made: dict[str, Ctx] = field(default_factory=dict)

    def get(self, dialect: str) -> Ctx:
        if dialect not in self.made:
            if dialect == "postgresql":
                url = self.schemas.new_url()
            elif dialect == "mysql":
                url = self.mysql.new_url()
            else:
                url = str(self.tmp / "c.db")
            init_database(url)
            engine = create_engine(url)
            self.made[dialect] = Ctx(dialect, url, engine, RunProjection(engine))
        return self.made[dialect]

    def close(self) -> None:
        for ctx in self.made.values():
            ctx.engine.dispose()


@pytest.fixture(scope="module")
def databases(
    tmp_path_factory: pytest.TempPathFactory, postgres_schemas: Any, mysql_databases: Any
) -> Iterator[Databases]:
    made = Databases(tmp_path_factory.mktemp("catalogue"), postgres_schemas, mysql_databases)
    yield made
    made.close()


def _reset(ctx: Ctx) -> None:
    with ctx.engine.begin() as connection:
        for table in (
            "relay_node_sessions",
            "relay_processed_reports",
            "relay_node_runtime",
            "relay_runs",
            "relay_executor_identity",
        ):
            connection.exec_driver_sql(f"DELETE FROM {table}")
    seed(ctx.projection)


@pytest.mark.parametrize(("dialect", "entry"), PARAMETERS)
def test_bad_input_catalogue(
    dialect: str, entry: Entry, databases: Databases, tmp_path: Path, postgres_schemas: Any
) -> None:
    ctx = databases.get(dialect)
    ctx.tmp_path = tmp_path
    ctx.new_schema = postgres_schemas.new_url
    _reset(ctx)
    target: Any = entry.payload
    if entry.target != "seeded":
        target = _make_target(entry.target, ctx)
        target_before = _target_state(entry.target, target, ctx)
    if isinstance(entry.expect, Stored) and entry.setup is not None:
        entry.setup(ctx.projection, entry.payload)
    before = snapshot(ctx.engine)

    expect = entry.expect
    if isinstance(expect, Refused):
        with pytest.raises(expect.error) as raised:
            entry.call(ctx, target)
        error = raised.value
        assert re.search(expect.match, str(error)), f"unclear message: {str(error)[:300]!r}"
        assert type(error).__module__ in ("builtins", "relay_flow_projection.errors"), type(error)
        assert len(str(error)) < 2_000, "the message must not echo a huge argument"
    elif isinstance(expect, Answered):
        assert entry.call(ctx, target) == expect.value
    else:
        entry.call(ctx, target)
        assert expect.check(ctx, entry.payload), "not stored verbatim"

    if not isinstance(expect, Stored):
        assert snapshot(ctx.engine) == before
    if entry.target != "seeded":
        assert _target_state(entry.target, target, ctx) == target_before


def test_catalogue_covers_every_category() -> None:
    """The issue's list, each present on every database (targets: SQLite by nature)."""
    categories = {(entry.category, dialect) for entry in CATALOGUE for dialect in entry.dialects}
    for category in (
        "datetime", "state", "empty id", "1 MB string", "NUL byte", "SQL injection", "number",
        "identity", "lone surrogate", "datetime subclass", "run filter", "keyset cursor",
    ):  # fmt: skip
        assert {(category, dialect) for dialect in BOTH} <= categories, category
    assert ("target", "sqlite") in categories
    assert ("target", "postgresql") in categories  # a database written by a newer release
    print(f"\nbad input catalogue: {len(CATALOGUE)} entries, {len(PARAMETERS)} cases")
