"""Every method of the API, written once for the sync and the async facade.

Each function validates its arguments (raising before anything touches the
database), binds the parameters, and returns an ``Operation``: what the call
is about and a ``body`` that runs its statements on one ``Connection``. The
facades only build operations and hand them to their executor
(``execution.py``), which owns the transaction; the async executor runs the
very same body in a greenlet that awaits the async driver.

Why ``run_sync`` rather than writing each operation as a sequence of steps
that a sync and an async driver loop both walk: the multi-statement
operations branch on what earlier statements returned (``update_node``,
``register_node_session``, ``verify_identity``, the sweep), and a step
protocol would turn each into a small state machine, a second shape of the
same logic. Nor would it be faster: an async step runner still executes
each Core statement through ``AsyncConnection.execute``, which itself runs
SQLAlchemy's sync execution in a greenlet -- one greenlet hop per statement
instead of one per operation. Measured here on 2026-12-05 (psycopg async,
an open connection, update_node's transaction of two statements, 2,000
calls, twice): as two ``AsyncConnection.execute`` steps 670-689 µs of CPU per
call, as one ``run_sync`` body 578-580 µs. Most of either is Core execution
through the async drivers' adapters (benchmarks/run.py, section 6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy.engine import Connection

from . import statements as sql
from . import validation as check
from .dialect import child_insert_locks_parent
from .errors import (
    IdentityMismatch,
    IdentityMissing,
    NodeRuntimeNotFound,
    NodeVisitNotCurrent,
    RunNotFound,
)
from .identity import validate_identity
from .models import (
    ExecutorIdentity,
    NodeRuntime,
    NodeSessionRegistration,
    RetryStatus,
    Run,
    RunFilter,
    RunStart,
    RunState,
)
from .timestamps import require_aware

if TYPE_CHECKING:
    from .retention import Sweep

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Operation(Generic[T]):
    """One call of the API: its body and what error messages should name.

    *subject* names the run, node or visit ("update_node of run 'r1' ...").
    *missing_run*: a foreign-key violation in this write means that run does
    not exist. *writes*: the body needs a write transaction.
    *deletes_dependents*: the body deletes every row that refers to what it
    deletes, itself, so SQLite's per-row foreign-key checks would find nothing:
    its transaction runs with ``foreign_keys`` off (execution._sqlite_foreign_keys_off).
    *settle*: for a write whose connection was lost while it committed, reads
    on a new connection whether it did: its answer if it committed, None if it
    did not (the executor then runs it once more). Without it such a call
    raises ``DatabaseUnavailable`` saying the outcome is unknown (API.md,
    *Ambiguous commits*).
    """

    subject: str
    body: Callable[[Connection], T]
    writes: bool
    missing_run: str | None = None
    deletes_dependents: bool = False
    settle: Callable[[Connection], T | None] | None = None


# ------------------------------------------------------------------ runs ---


def insert_start(start: RunStart, now: datetime) -> Operation[None]:
    if not isinstance(start, RunStart):
        raise TypeError(f"start must be a RunStart, not {type(start).__name__}")
    run_id = check.required_text(start.id, "run id")
    params = {
        "id": run_id,
        "logical_run_id": check.plain_text(start.logical_id, "logical_id") or run_id,
        "attempt_id": check.non_negative(start.attempt_id, "attempt_id") or 1,
        "repo": check.plain_text(start.repo, "repo"),
        "workflow": check.plain_text(start.workflow, "workflow"),
        "ticket_id": check.plain_text(start.ticket_id, "ticket_id"),
        "ticket_key": check.plain_text(start.ticket_key, "ticket_key"),
        "state": RunState.STARTING.value,
        "now": require_aware(now, "now"),
    }

    def body(conn: Connection) -> None:
        # A second start of the same id changes nothing (ON CONFLICT DO NOTHING).
        conn.execute(sql.insert_start(conn.dialect.name), params)

    return Operation(f"insert_start of run {run_id!r}", body, writes=True)


def update_state(
    run_id: str,
    state: RunState | str,
    last_error: str | None,
    finished_at: datetime | None,
    now: datetime,
) -> Operation[None]:
    new_state = check.run_state(state)
    params = {
        "run": check.required_text(run_id, "run_id"),
        "state": new_state.value,
        "last_error": check.optional_text(last_error, "last_error", key=False),
        "finished_at": None if finished_at is None else require_aware(finished_at, "finished_at"),
        "now": now,
    }
    statement = sql.UPDATE_STATE_TERMINAL if new_state.is_terminal else sql.UPDATE_STATE
    return _update_run("update_state", run_id, statement, params)


def update_retry(run_id: str, status: RetryStatus | None, now: datetime) -> Operation[None]:
    params: dict[str, Any] = {"run": check.required_text(run_id, "run_id"), "now": now}
    if status is None:
        statement = sql.CLEAR_RETRY
    else:
        if not isinstance(status, RetryStatus):
            raise TypeError(f"status must be a RetryStatus or None, not {type(status).__name__}")
        statement = sql.SET_RETRY
        params["retry_attempt"] = check.non_negative(status.attempt, "retry attempt")
        params["retry_error"] = check.plain_text(status.last_error, "retry last_error", key=False)
        params["next_retry_at"] = require_aware(status.next_retry_at, "next_retry_at")
    return _update_run("update_retry", run_id, statement, params)


def _update_run(what: str, run_id: str, statement: Any, params: dict[str, Any]) -> Operation[None]:
    def body(conn: Connection) -> None:
        if conn.execute(statement, params).rowcount != 1:
            raise RunNotFound(f"run {run_id!r} not found")

    return Operation(f"{what} of run {run_id!r}", body, writes=True)


def update_node(
    run_id: str, state: RunState | str, node: str, visit_id: str, now: datetime
) -> Operation[None]:
    params = {
        "run": check.required_text(run_id, "run_id"),
        "state": check.run_state(state).value,
        "node_name": check.required_text(node, "node"),
        "visit": check.required_text(visit_id, "visit_id"),
        "now": now,
    }

    def body(conn: Connection) -> None:
        # The run row first: on PostgreSQL its row lock orders concurrent
        # update_node calls on one run; on SQLite the write lock is held.
        if conn.execute(sql.UPDATE_CURRENT_NODE, params).rowcount != 1:
            raise RunNotFound(f"run {run_id!r} not found")
        # A revisit changes only the visit; terminal and session ids stay.
        conn.execute(sql.upsert_node_visit(conn.dialect.name), params)

    subject = f"update_node of run {run_id!r} node {node!r} visit {visit_id!r}"
    return Operation(subject, body, writes=True, missing_run=run_id)


def _find_run(statement: Any, params: dict[str, str], subject: str) -> Operation[Run]:
    def body(conn: Connection) -> Run:
        row = conn.execute(statement, params).first()
        if row is None:
            raise RunNotFound(f"{subject} not found")
        return sql.row_to_run(row)

    return Operation(f"reading {subject}", body, writes=False)


def get_run(run_id: str) -> Operation[Run]:
    check.plain_text(run_id, "run_id")
    return _find_run(sql.GET_RUN, {"run": run_id}, f"run {run_id!r}")


def find_run_by_ticket(ticket_key: str) -> Operation[Run]:
    check.plain_text(ticket_key, "ticket_key")
    return _find_run(sql.FIND_RUN_BY_TICKET, {"key": ticket_key}, f"run for ticket {ticket_key!r}")


def find_run_by_logical_id(logical_id: str) -> Operation[Run]:
    check.plain_text(logical_id, "logical_id")
    return _find_run(
        sql.FIND_RUN_BY_LOGICAL_ID, {"key": logical_id}, f"run with logical id {logical_id!r}"
    )


def list_runs(
    filter: RunFilter | None, limit: int | None, after: Run | None
) -> Operation[list[Run]]:
    wanted = check.run_filter(filter)
    start = check.keyset_after(after)
    if limit is not None:
        check.non_negative(limit, "limit")

    def body(conn: Connection) -> list[Run]:
        if limit == 0:
            return []
        return sql.list_runs(
            conn, wanted.repo, wanted.workflow, wanted.ticket, wanted.active, start, limit
        )

    return Operation("list_runs", body, writes=False)


class RunPages:
    """``iter_runs`` for both facades: keyset pages, one read each, memory flat."""

    __slots__ = ("_after", "_batch_size", "_filter", "done")

    def __init__(self, filter: RunFilter | None, batch_size: int) -> None:
        self._batch_size = check.positive(batch_size, "batch_size")
        self._filter = check.run_filter(filter)
        self._after: Run | None = None
        self.done = False

    def next_page(self) -> Operation[list[Run]]:
        page = list_runs(self._filter, self._batch_size, self._after)
        read = page.body

        def body(conn: Connection) -> list[Run]:
            runs = read(conn)
            self.done = len(runs) < self._batch_size
            if runs:
                self._after = runs[-1]
            return runs

        return Operation(page.subject, body, writes=False)


def count_runs(filter: RunFilter | None) -> Operation[dict[RunState, int]]:
    wanted = check.run_filter(filter)

    def body(conn: Connection) -> dict[RunState, int]:
        return sql.count_runs(conn, wanted.repo, wanted.workflow, wanted.ticket, wanted.active)

    return Operation("count_runs", body, writes=False)


def _exists(statement: Any, params: dict[str, str], subject: str) -> Operation[bool]:
    def body(conn: Connection) -> bool:
        return bool(conn.execute(statement, params).scalar_one())

    return Operation(f"reading {subject}", body, writes=False)


def has_active_workflow(workflow: str) -> Operation[bool]:
    check.plain_text(workflow, "workflow")
    return _exists(sql.HAS_ACTIVE_WORKFLOW, {"value": workflow}, f"workflow {workflow!r}")


def has_active_repo(repo: str) -> Operation[bool]:
    check.plain_text(repo, "repo")
    return _exists(sql.HAS_ACTIVE_REPO, {"value": repo}, f"repo {repo!r}")


def sweep_batch(sweep: Sweep) -> Operation[list[str]]:
    """The next batch of a sweep, in one write transaction (retention.py chooses and deletes).

    On SQLite the batch deletes its runs' child rows itself, table by table,
    so it needs no foreign-key checks (execution._sqlite_foreign_keys_off).
    """
    return Operation(
        "sweep_retention",
        sweep.run_batch,
        writes=True,
        deletes_dependents=True,
        settle=sweep.settle_lost_commit,
    )


def count_sweepable(older_than: datetime) -> Operation[int]:
    params = {"older_than": require_aware(older_than, "older_than")}

    def body(conn: Connection) -> int:
        from .retention import COUNT_SWEEPABLE

        return int(conn.execute(COUNT_SWEEPABLE, params).scalar_one())

    return Operation("count_sweepable", body, writes=False)


# ---------------------------------------------------------- node runtimes ---


def _read_node_runtime(
    run_id: str, node: str, absent: Callable[[str], NodeRuntime]
) -> Operation[NodeRuntime]:
    check.plain_text(run_id, "run_id")
    check.plain_text(node, "node")
    subject = f"node {node!r} of run {run_id!r}"

    def body(conn: Connection) -> NodeRuntime:
        row = conn.execute(sql.GET_NODE_RUNTIME, {"run": run_id, "node_name": node}).first()
        return absent(subject) if row is None else sql.row_to_node_runtime(row)

    return Operation(f"reading {subject}", body, writes=False)


def get_node_runtime(run_id: str, node: str) -> Operation[NodeRuntime]:
    def absent(subject: str) -> NodeRuntime:
        raise NodeRuntimeNotFound(f"no runtime binding for {subject}")

    return _read_node_runtime(run_id, node, absent)


def load_node_runtime(run_id: str, node: str) -> Operation[NodeRuntime]:
    return _read_node_runtime(run_id, node, lambda _: NodeRuntime(run_id=run_id, node=node))


def update_node_runtime(runtime: NodeRuntime, now: datetime) -> Operation[None]:
    if not isinstance(runtime, NodeRuntime):
        raise TypeError(f"runtime must be a NodeRuntime, not {type(runtime).__name__}")
    params = {
        "run": check.required_text(runtime.run_id, "run_id"),
        "node_name": check.required_text(runtime.node, "node"),
        "terminal": check.optional_text(runtime.terminal_id, "terminal_id", key=False),
        "session": check.optional_text(runtime.session_id, "session_id"),
        # None is the empty binding's visit: as empty as "".
        "visit": check.required_text(runtime.node_visit_id or "", "node_visit_id"),
        "now": now,
    }

    def body(conn: Connection) -> None:
        conn.execute(sql.upsert_node_runtime(conn.dialect.name), params)

    subject = f"update_node_runtime of run {runtime.run_id!r} node {runtime.node!r}"
    return Operation(subject, body, writes=True, missing_run=runtime.run_id)


def update_node_runtime_visit(
    run_id: str, node: str, visit_id: str, now: datetime
) -> Operation[None]:
    params = {
        "run": check.required_text(run_id, "run_id"),
        "node_name": check.required_text(node, "node"),
        "visit": check.required_text(visit_id, "visit_id"),
        "now": now,
    }

    def body(conn: Connection) -> None:
        conn.execute(sql.upsert_node_visit(conn.dialect.name), params)

    subject = f"update_node_runtime_visit of run {run_id!r} node {node!r} visit {visit_id!r}"
    return Operation(subject, body, writes=True, missing_run=run_id)


def node_runtime_visit_is_current(run_id: str, node: str, visit_id: str) -> Operation[bool]:
    params = {
        "run": check.plain_text(run_id, "run_id"),
        "node_name": check.plain_text(node, "node"),
        "visit": check.plain_text(visit_id, "visit_id"),
    }
    return _exists(sql.NODE_VISIT_IS_CURRENT, params, f"node {node!r} of run {run_id!r}")


def replace_node_runtime(
    run_id: str,
    node: str,
    visit_id: str,
    terminal_id: str | None,
    previous_session_id: str | None,
    session_id: str | None,
    now: datetime,
) -> Operation[None]:
    params = {
        "run": check.required_text(run_id, "run_id"),
        "node_name": check.required_text(node, "node"),
        "visit": check.required_text(visit_id, "visit_id"),
        "terminal": check.optional_text(terminal_id, "terminal_id", key=False),
        # None (or '') matches a binding that has no session.
        "previous": check.optional_text(previous_session_id, "previous_session_id") or "",
        "session": check.optional_text(session_id, "session_id"),
        "now": now,
    }
    subject = f"node {node!r} of run {run_id!r} visit {visit_id!r}"

    def body(conn: Connection) -> None:
        if conn.execute(sql.REPLACE_NODE_RUNTIME, params).rowcount != 1:
            raise NodeVisitNotCurrent(f"{subject} is not the current visit")

    return Operation(f"replace_node_runtime of {subject}", body, writes=True)


def clear_node_runtime(
    run_id: str, node: str, clear_terminal: bool, clear_session: bool, now: datetime
) -> Operation[None]:
    params = {
        "run": check.required_text(run_id, "run_id"),
        "node_name": check.required_text(node, "node"),
        "now": now,
    }
    statement = sql.clear_node_runtime(bool(clear_terminal), bool(clear_session))

    def body(conn: Connection) -> None:
        conn.execute(statement, params)  # no binding: nothing to clear

    return Operation(f"clear_node_runtime of node {node!r} of run {run_id!r}", body, writes=True)


def list_node_runtimes(run_id: str) -> Operation[list[NodeRuntime]]:
    check.plain_text(run_id, "run_id")

    def body(conn: Connection) -> list[NodeRuntime]:
        rows = conn.execute(sql.LIST_NODE_RUNTIMES, {"run": run_id})
        return [sql.row_to_node_runtime(row) for row in rows]

    return Operation(f"reading node runtimes of run {run_id!r}", body, writes=False)


def register_node_session(registration: NodeSessionRegistration, now: datetime) -> Operation[bool]:
    if not isinstance(registration, NodeSessionRegistration):
        raise TypeError(
            f"registration must be a NodeSessionRegistration, not {type(registration).__name__}"
        )
    params = {
        "run": check.required_text(registration.run_id, "run_id"),
        "node_name": check.required_text(registration.node, "node"),
        "session": check.required_text(registration.session_id, "session_id"),
        "now": now,
    }

    def body(conn: Connection) -> bool:
        if child_insert_locks_parent(conn.dialect):
            conn.execute(sql.LOCK_RUN, params)  # update_node's lock order: run, then binding
        current = conn.execute(sql.LOCK_CURRENT_VISIT, params).scalar_one_or_none()
        if current is None:
            return False
        bound = {**params, "visit": current}
        # The first registration records the visit the session belongs to.
        conn.execute(sql.insert_session_once(conn.dialect.name), bound)
        first_seen = conn.execute(sql.SESSION_FIRST_VISIT, bound).scalar_one()
        if first_seen != current:
            return False  # a session of an earlier visit never binds to a later one
        return bool(conn.execute(sql.BIND_SESSION, bound).rowcount == 1)

    subject = (
        f"register_node_session of session {registration.session_id!r} "
        f"for node {registration.node!r} of run {registration.run_id!r}"
    )
    return Operation(subject, body, writes=True)


# ---------------------------------------------------------------- reports ---


def has_processed_report(run_id: str, report_id: str) -> Operation[bool]:
    params = {
        "run": check.plain_text(run_id, "run_id"),
        "report": check.plain_text(report_id, "report_id"),
    }
    return _exists(sql.HAS_PROCESSED_REPORT, params, f"report {report_id!r} of run {run_id!r}")


def record_processed_report(
    run_id: str, visit_id: str, report_id: str, now: datetime
) -> Operation[None]:
    params = {
        "run": check.required_text(run_id, "run_id"),
        "visit": check.required_text(visit_id, "visit_id"),
        "report": check.required_text(report_id, "report_id"),
        "now": now,
    }

    def body(conn: Connection) -> None:
        conn.execute(sql.record_processed_report(conn.dialect.name), params)

    subject = f"record_processed_report {report_id!r} of run {run_id!r} visit {visit_id!r}"
    return Operation(subject, body, writes=True, missing_run=run_id)


# --------------------------------------------------------------- identity ---


def _read_identity(conn: Connection) -> ExecutorIdentity | None:
    row = conn.execute(sql.READ_IDENTITY).first()
    return None if row is None else sql.row_to_identity(row)


def identity() -> Operation[ExecutorIdentity | None]:
    return Operation("reading the executor identity", _read_identity, writes=False)


def _write_identity_once(conn: Connection, wanted: ExecutorIdentity) -> None:
    # Insert-if-absent, then compare: of concurrent initializers exactly one
    # writes the marker and every other one verifies against it.
    params = {
        "executor_plugin": wanted.executor_plugin,
        "temporal_address": wanted.temporal_address or None,
        "temporal_namespace": wanted.temporal_namespace or None,
    }
    conn.execute(sql.insert_identity_once(conn.dialect.name), params)
    persisted = sql.row_to_identity(conn.execute(sql.READ_IDENTITY).one())
    require_same_identity(wanted, persisted)


def initialize_identity(wanted: ExecutorIdentity) -> Operation[None]:
    validate_identity(wanted)

    def body(conn: Connection) -> None:
        _write_identity_once(conn, wanted)

    return Operation("initialize_identity", body, writes=True)


def verify_identity(wanted: ExecutorIdentity) -> Operation[None]:
    """One write transaction, so that adopting a missing marker cannot race another verifier."""
    validate_identity(wanted)

    def body(conn: Connection) -> None:
        persisted = _read_identity(conn)
        if persisted is not None:
            require_same_identity(wanted, persisted)
        elif wanted.executor_plugin != "goworkflows":
            raise IdentityMissing(
                "the database has no executor identity marker; a Temporal installation "
                "requires one written by init_database_with_identity"
            )
        else:
            _write_identity_once(conn, wanted)  # the embedded executor adopts a legacy home

    return Operation("verify_identity", body, writes=True)


def describe_identity(identity: ExecutorIdentity) -> str:
    """An identity as operators write it in configuration."""
    if identity.executor_plugin == "temporal":
        return (
            f"temporal (address {identity.temporal_address!r}, "
            f"namespace {identity.temporal_namespace!r})"
        )
    extra = [
        f"{name} {value!r}"
        for name, value in (
            ("address", identity.temporal_address),
            ("namespace", identity.temporal_namespace),
        )
        if value
    ]
    return identity.executor_plugin + (f" ({', '.join(extra)})" if extra else "")


def require_same_identity(configured: ExecutorIdentity, persisted: ExecutorIdentity) -> None:
    if configured != persisted:
        raise IdentityMismatch(
            f"executor identity mismatch: configured {describe_identity(configured)}, "
            f"but the database belongs to {describe_identity(persisted)}"
        )
