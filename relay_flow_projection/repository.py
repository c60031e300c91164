"""``RunProjection``: the synchronous facade of API.md.

Each method builds its operation (``operations.py``: validation, parameters,
statements) and runs it on the ``SyncExecutor`` (``execution.py``: the
transaction, retries, error translation). ``async_repository.py`` is the
same facade for asyncio; neither holds logic of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from sqlalchemy.engine import Engine

from . import operations as op
from .errors import ProjectionError
from .execution import SyncExecutor
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
from .operations import Operation
from .timestamps import require_aware

if TYPE_CHECKING:
    from .retention import Sweep

Clock = Callable[[], datetime]
T = TypeVar("T")
Archive = str | os.PathLike[str] | BinaryIO


def utc_now() -> datetime:
    return datetime.now(UTC)


class RunProjection:
    """The run projection repository on one engine (see API.md for each method)."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self._engine = engine
        self._executor = SyncExecutor(engine)
        self._clock: Clock = clock or utc_now
        self._owns_engine = False
        self._closed = False

    @classmethod
    def _owning(cls, engine: Engine) -> RunProjection:
        """A projection that disposes *engine* on close (open_projection's)."""
        projection = cls(engine)
        projection._owns_engine = True
        return projection

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.close()
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> RunProjection:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self, operation: Operation[T]) -> T:
        if self._closed:
            raise ProjectionError(f"{operation.subject}: the projection is closed")
        return self._executor.run(operation)

    def _now(self) -> datetime:
        return require_aware(self._clock(), "clock()")

    # ------------------------------------------------------------ runs ---

    def insert_start(self, start: RunStart, now: datetime) -> None:
        self._run(op.insert_start(start, now))

    def update_state(
        self,
        run_id: str,
        state: RunState | str,
        last_error: str | None = None,
        finished_at: datetime | None = None,
    ) -> None:
        self._run(op.update_state(run_id, state, last_error, finished_at, self._now()))

    def update_retry(self, run_id: str, status: RetryStatus | None) -> None:
        self._run(op.update_retry(run_id, status, self._now()))

    def update_node(self, run_id: str, state: RunState | str, node: str, visit_id: str) -> None:
        self._run(op.update_node(run_id, state, node, visit_id, self._now()))

    def get_run(self, run_id: str) -> Run:
        return self._run(op.get_run(run_id))

    def find_run_by_ticket(self, ticket_key: str) -> Run:
        return self._run(op.find_run_by_ticket(ticket_key))

    def find_run_by_logical_id(self, logical_id: str) -> Run:
        return self._run(op.find_run_by_logical_id(logical_id))

    def list_runs(
        self, filter: RunFilter | None = None, *, limit: int | None = None, after: Run | None = None
    ) -> list[Run]:
        return self._run(op.list_runs(filter, limit, after))

    def iter_runs(self, filter: RunFilter | None = None, *, batch_size: int = 500) -> Iterator[Run]:
        pages = op.RunPages(filter, batch_size)  # arguments checked now, not at first next()
        return self._iter_pages(pages)

    def _iter_pages(self, pages: op.RunPages) -> Iterator[Run]:
        while not pages.done:
            yield from self._run(pages.next_page())

    def count_runs(self, filter: RunFilter | None = None) -> dict[RunState, int]:
        return self._run(op.count_runs(filter))

    def has_active_workflow(self, workflow: str) -> bool:
        return self._run(op.has_active_workflow(workflow))

    def has_active_repo(self, repo: str) -> bool:
        return self._run(op.has_active_repo(repo))

    def sweep_retention(
        self,
        older_than: datetime,
        *,
        batch_size: int = 1000,
        archive: Archive | None = None,
        target_batch_seconds: float | None = None,
    ) -> list[str]:
        batches = self.sweep_retention_batches(
            older_than,
            batch_size=batch_size,
            archive=archive,
            target_batch_seconds=target_batch_seconds,
        )
        return [run_id for batch in batches for run_id in batch]

    def sweep_retention_batches(
        self,
        older_than: datetime,
        *,
        batch_size: int = 1000,
        archive: Archive | None = None,
        target_batch_seconds: float | None = None,
    ) -> Iterator[list[str]]:
        """sweep_retention one committed batch at a time (for progress reporting)."""
        from .retention import DEFAULT_TARGET_BATCH_SECONDS, Sweep

        sweep = Sweep(
            older_than,
            batch_size=batch_size,
            target_batch_seconds=(
                DEFAULT_TARGET_BATCH_SECONDS
                if target_batch_seconds is None
                else target_batch_seconds
            ),
            archive=archive,
        )
        return self._sweep_batches(sweep)

    def _sweep_batches(self, sweep: Sweep) -> Iterator[list[str]]:
        try:
            while not sweep.done:
                batch = self._run(op.sweep_batch(sweep))
                sweep.batch_committed()  # times the batch through its commit
                if batch:
                    yield batch
        finally:
            sweep.close()

    def count_sweepable(self, older_than: datetime) -> int:
        return self._run(op.count_sweepable(older_than))

    # --------------------------------------------------- node runtimes ---

    def get_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        return self._run(op.get_node_runtime(run_id, node))

    def load_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        return self._run(op.load_node_runtime(run_id, node))

    def update_node_runtime(self, runtime: NodeRuntime) -> None:
        self._run(op.update_node_runtime(runtime, self._now()))

    def update_node_runtime_visit(self, run_id: str, node: str, visit_id: str) -> None:
        self._run(op.update_node_runtime_visit(run_id, node, visit_id, self._now()))

    def node_runtime_visit_is_current(self, run_id: str, node: str, visit_id: str) -> bool:
        return self._run(op.node_runtime_visit_is_current(run_id, node, visit_id))

    def replace_node_runtime(
        self,
        run_id: str,
        node: str,
        visit_id: str,
        terminal_id: str | None,
        previous_session_id: str | None,
        session_id: str | None,
    ) -> None:
        self._run(
            op.replace_node_runtime(
                run_id, node, visit_id, terminal_id, previous_session_id, session_id, self._now()
            )
        )

    def clear_node_runtime(
        self, run_id: str, node: str, *, clear_terminal: bool, clear_session: bool
    ) -> None:
        self._run(op.clear_node_runtime(run_id, node, clear_terminal, clear_session, self._now()))

    def list_node_runtimes(self, run_id: str) -> list[NodeRuntime]:
        return self._run(op.list_node_runtimes(run_id))

    def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        return self._run(op.register_node_session(registration, self._now()))

    # --------------------------------------------------------- reports ---

    def has_processed_report(self, run_id: str, report_id: str) -> bool:
        return self._run(op.has_processed_report(run_id, report_id))

    def record_processed_report(self, run_id: str, visit_id: str, report_id: str) -> None:
        self._run(op.record_processed_report(run_id, visit_id, report_id, self._now()))

    # -------------------------------------------------------- identity ---

    def identity(self) -> ExecutorIdentity | None:
        return self._run(op.identity())

    def initialize_identity(self, identity: ExecutorIdentity) -> None:
        self._run(op.initialize_identity(identity))

    def verify_identity(self, identity: ExecutorIdentity) -> None:
        self._run(op.verify_identity(identity))
