"""An in-memory model of the projection: the Go semantics as amended by API.md.

Plain dictionaries, no SQL. Every repository operation has a method here with
the same arguments and result (or exception); the stateful test runs both
side by side. Where the Go code and API.md differ, API.md wins: '' in an
optional identifier is None, writes to an unknown run raise RunNotFound,
timestamps come back in UTC, replace_node_runtime on a visit that is not
current raises NodeVisitNotCurrent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from relay_flow_projection import (
    ExecutorIdentity,
    IdentityMismatch,
    IdentityMissing,
    NodeRuntime,
    NodeRuntimeNotFound,
    NodeSessionRegistration,
    NodeVisitNotCurrent,
    RetryStatus,
    Run,
    RunFilter,
    RunNotFound,
    RunStart,
    RunState,
)


class Clock:
    """The controllable clock given to RunProjection(clock=...)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@dataclass
class _Run:
    run: Run
    retry_error: str | None = None
    retry_attempt: int | None = None
    next_retry_at: datetime | None = None

    def view(self) -> Run:
        retry = None
        if (
            self.retry_error is not None
            and self.retry_attempt is not None
            and self.next_retry_at is not None
        ):
            retry = RetryStatus(self.retry_attempt, self.retry_error, self.next_retry_at)
        return replace(self.run, retry=retry)


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _matches(run: Run, wanted: RunFilter) -> bool:
    # As the Go code: an empty filter value means "any".
    if wanted.repo and run.repo != wanted.repo:
        return False
    if wanted.workflow and run.workflow != wanted.workflow:
        return False
    if wanted.ticket and run.ticket_key != wanted.ticket:
        return False
    return wanted.active is None or wanted.active == (not run.state.is_terminal)


class Model:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.runs: dict[str, _Run] = {}
        self.runtimes: dict[tuple[str, str], NodeRuntime] = {}
        self.sessions: dict[tuple[str, str, str], tuple[str, datetime]] = {}
        self.reports: dict[tuple[str, str], tuple[str, datetime]] = {}
        self.marker: ExecutorIdentity | None = None

    def _run(self, run_id: str) -> _Run:
        found = self.runs.get(run_id)
        if found is None:
            raise RunNotFound(run_id)
        return found

    # ------------------------------------------------------------ runs ---

    def insert_start(self, start: RunStart, now: datetime) -> None:
        if start.id in self.runs:
            return
        at = _utc(now)
        self.runs[start.id] = _Run(
            Run(
                id=start.id,
                logical_id=start.logical_id or start.id,
                attempt_id=start.attempt_id or 1,
                repo=start.repo,
                workflow=start.workflow,
                ticket_id=start.ticket_id,
                ticket_key=start.ticket_key,
                state=RunState.STARTING,
                current_node=None,
                current_node_visit_id=None,
                last_error=None,
                retry=None,
                started_at=at,
                updated_at=at,
                finished_at=None,
            )
        )

    def update_state(
        self,
        run_id: str,
        state: RunState | str,
        last_error: str | None = None,
        finished_at: datetime | None = None,
    ) -> None:
        record = self._run(run_id)
        new_state = RunState(state)
        record.run = replace(
            record.run,
            state=new_state,
            last_error=last_error or None,
            updated_at=self.clock(),
            finished_at=record.run.finished_at if finished_at is None else _utc(finished_at),
        )
        if new_state.is_terminal:
            record.retry_error = record.retry_attempt = record.next_retry_at = None

    def update_retry(self, run_id: str, status: RetryStatus | None) -> None:
        record = self._run(run_id)
        if status is None:
            record.retry_error = record.retry_attempt = record.next_retry_at = None
        else:
            record.retry_error = status.last_error
            record.retry_attempt = status.attempt
            record.next_retry_at = _utc(status.next_retry_at)
        record.run = replace(record.run, updated_at=self.clock())

    def update_node(self, run_id: str, state: RunState | str, node: str, visit_id: str) -> None:
        record = self._run(run_id)
        now = self.clock()
        record.run = replace(
            record.run,
            state=RunState(state),
            current_node=node,
            current_node_visit_id=visit_id,
            updated_at=now,
        )
        self._move_visit(run_id, node, visit_id)

    def get_run(self, run_id: str) -> Run:
        return self._run(run_id).view()

    def _latest(self, candidates: list[Run]) -> list[Run]:
        """Every run that may come first in (started_at desc, attempt_id desc) order."""
        if not candidates:
            raise RunNotFound("no run")
        best = max((run.started_at, run.attempt_id) for run in candidates)
        return [run for run in candidates if (run.started_at, run.attempt_id) == best]

    def find_run_by_ticket(self, ticket_key: str) -> list[Run]:
        return self._latest(
            [r.view() for r in self.runs.values() if r.run.ticket_key == ticket_key]
        )

    def find_run_by_logical_id(self, logical_id: str) -> list[Run]:
        return self._latest(
            [r.view() for r in self.runs.values() if r.run.logical_id == logical_id]
        )

    def list_runs(
        self, filter: RunFilter | None = None, *, limit: int | None = None, after: Run | None = None
    ) -> list[Run]:
        wanted = filter or RunFilter()
        found = sorted(
            (r.view() for r in self.runs.values() if _matches(r.run, wanted)),
            key=lambda run: (run.started_at, run.id),
        )
        if after is not None:
            key = (after.started_at, after.id)
            found = [run for run in found if (run.started_at, run.id) > key]
        return found if limit is None else found[:limit]

    def count_runs(self, filter: RunFilter | None = None) -> dict[RunState, int]:
        return dict(Counter(run.state for run in self.list_runs(filter)))

    def has_active_workflow(self, workflow: str) -> bool:
        return any(
            r.run.workflow == workflow and not r.run.state.is_terminal for r in self.runs.values()
        )

    def has_active_repo(self, repo: str) -> bool:
        return any(r.run.repo == repo and not r.run.state.is_terminal for r in self.runs.values())

    def _sweepable(self, older_than: datetime) -> list[str]:
        return [
            run_id
            for run_id, r in self.runs.items()
            if r.run.state.is_terminal
            and r.run.finished_at is not None
            and r.run.finished_at < older_than
        ]

    def sweep_retention(self, older_than: datetime, *, batch_size: int = 1000) -> list[str]:
        doomed = self._sweepable(older_than)
        for run_id in doomed:
            del self.runs[run_id]
        # Their child rows go with them.
        self.runtimes = {k: v for k, v in self.runtimes.items() if k[0] not in doomed}
        self.sessions = {k: v for k, v in self.sessions.items() if k[0] not in doomed}
        self.reports = {k: v for k, v in self.reports.items() if k[0] not in doomed}
        return doomed

    def count_sweepable(self, older_than: datetime) -> int:
        return len(self._sweepable(older_than))

    # --------------------------------------------------- node runtimes ---

    def _move_visit(self, run_id: str, node: str, visit_id: str) -> None:
        current = self.runtimes.get((run_id, node))
        if current is None:
            current = NodeRuntime(run_id, node)
        self.runtimes[(run_id, node)] = replace(
            current, node_visit_id=visit_id, updated_at=self.clock()
        )

    def get_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        found = self.runtimes.get((run_id, node))
        if found is None:
            raise NodeRuntimeNotFound(f"{run_id}/{node}")
        return found

    def load_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        return self.runtimes.get((run_id, node), NodeRuntime(run_id, node))

    def update_node_runtime(self, runtime: NodeRuntime) -> None:
        self._run(runtime.run_id)
        self.runtimes[(runtime.run_id, runtime.node)] = replace(
            runtime,
            terminal_id=runtime.terminal_id or None,
            session_id=runtime.session_id or None,
            updated_at=self.clock(),
        )

    def update_node_runtime_visit(self, run_id: str, node: str, visit_id: str) -> None:
        self._run(run_id)
        self._move_visit(run_id, node, visit_id)

    def node_runtime_visit_is_current(self, run_id: str, node: str, visit_id: str) -> bool:
        found = self.runtimes.get((run_id, node))
        return found is not None and found.node_visit_id == visit_id

    def replace_node_runtime(
        self,
        run_id: str,
        node: str,
        visit_id: str,
        terminal_id: str | None,
        previous_session_id: str | None,
        session_id: str | None,
    ) -> None:
        found = self.runtimes.get((run_id, node))
        if found is None or found.node_visit_id != visit_id:
            raise NodeVisitNotCurrent(f"{run_id}/{node}/{visit_id}")
        session = found.session_id
        if (found.session_id or "") == (previous_session_id or ""):
            session = session_id or None
        self.runtimes[(run_id, node)] = replace(
            found, terminal_id=terminal_id or None, session_id=session, updated_at=self.clock()
        )

    def clear_node_runtime(
        self, run_id: str, node: str, *, clear_terminal: bool, clear_session: bool
    ) -> None:
        found = self.runtimes.get((run_id, node))
        if found is None:
            return
        self.runtimes[(run_id, node)] = replace(
            found,
            terminal_id=None if clear_terminal else found.terminal_id,
            session_id=None if clear_session else found.session_id,
            updated_at=self.clock(),
        )

    def list_node_runtimes(self, run_id: str) -> list[NodeRuntime]:
        return [self.runtimes[key] for key in sorted(self.runtimes) if key[0] == run_id]

    def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        run_id, node, session = registration.run_id, registration.node, registration.session_id
        found = self.runtimes.get((run_id, node))
        if found is None or found.node_visit_id is None:
            return False
        key = (run_id, node, session)
        if key not in self.sessions:
            self.sessions[key] = (found.node_visit_id, self.clock())
        if self.sessions[key][0] != found.node_visit_id:
            return False
        self.runtimes[(run_id, node)] = replace(found, session_id=session, updated_at=self.clock())
        return True

    # --------------------------------------------------------- reports ---

    def has_processed_report(self, run_id: str, report_id: str) -> bool:
        return (run_id, report_id) in self.reports

    def record_processed_report(self, run_id: str, visit_id: str, report_id: str) -> None:
        self._run(run_id)
        self.reports.setdefault((run_id, report_id), (visit_id, self.clock()))

    # -------------------------------------------------------- identity ---

    def identity(self) -> ExecutorIdentity | None:
        return self.marker

    def initialize_identity(self, identity: ExecutorIdentity) -> None:
        if self.marker is None:
            self.marker = identity
        elif self.marker != identity:
            raise IdentityMismatch(str(identity))

    def verify_identity(self, identity: ExecutorIdentity) -> None:
        if self.marker is None:
            if identity.executor_plugin != "goworkflows":
                raise IdentityMissing(str(identity))
            self.marker = identity
        elif self.marker != identity:
            raise IdentityMismatch(str(identity))
