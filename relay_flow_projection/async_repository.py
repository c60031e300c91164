"""``AsyncRunProjection``: the asyncio facade of API.md.

The same methods as ``RunProjection``, as coroutines, built from the same
operations (``operations.py``) and run by ``AsyncExecutor``, which drives each
operation's one synchronous body on the async driver in a greenlet
(execution.py says how).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from . import operations as op
from .errors import ProjectionError
from .execution import AsyncExecutor
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
from .repository import Archive, utc_now
from .timestamps import require_aware

if TYPE_CHECKING:
    # Only for annotations: importing the asyncio extension needs greenlet (the
    # [async] extra), and `from relay_flow_projection import *` must work without it.
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .retention import Sweep

Clock = Callable[[], datetime]
T = TypeVar("T")


class AsyncRunProjection:
    """The run projection repository on one AsyncEngine (see API.md, "The asyncio API")."""

    def __init__(self, engine: AsyncEngine, *, clock: Clock | None = None) -> None:
        self._engine = engine
        self._executor = AsyncExecutor(engine)
        self._clock: Clock = clock or utc_now
        self._owns_engine = False
        self._closed = False

    @classmethod
    def _owning(cls, engine: AsyncEngine) -> AsyncRunProjection:
        """A projection that disposes *engine* on close (open_async_projection's)."""
        projection = cls(engine)
        projection._owns_engine = True
        return projection

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._executor.close()
        if self._owns_engine:
            await self._engine.dispose()

    async def __aenter__(self) -> AsyncRunProjection:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _run(self, operation: Operation[T]) -> T:
        if self._closed:
            raise ProjectionError(f"{operation.subject}: the projection is closed")
        return await self._executor.run(operation)

    def _now(self) -> datetime:
        return require_aware(self._clock(), "clock()")

    # ------------------------------------------------------------ runs ---

    async def insert_start(self, start: RunStart, now: datetime) -> None:
        await self._run(op.insert_start(start, now))

    async def update_state(
        self,
        run_id: str,
        state: RunState | str,
        last_error: str | None = None,
        finished_at: datetime | None = None,
    ) -> None:
        await self._run(op.update_state(run_id, state, last_error, finished_at, self._now()))

    async def update_retry(self, run_id: str, status: RetryStatus | None) -> None:
        await self._run(op.update_retry(run_id, status, self._now()))

    async def update_node(
        self, run_id: str, state: RunState | str, node: str, visit_id: str
    ) -> None:
        await self._run(op.update_node(run_id, state, node, visit_id, self._now()))

    async def get_run(self, run_id: str) -> Run:
        return await self._run(op.get_run(run_id))

    async def find_run_by_ticket(self, ticket_key: str) -> Run:
        return await self._run(op.find_run_by_ticket(ticket_key))

    async def find_run_by_logical_id(self, logical_id: str) -> Run:
        return await self._run(op.find_run_by_logical_id(logical_id))

    async def list_runs(
        self, filter: RunFilter | None = None, *, limit: int | None = None, after: Run | None = None
    ) -> list[Run]:
        return await self._run(op.list_runs(filter, limit, after))

    def iter_runs(
        self, filter: RunFilter | None = None, *, batch_size: int = 500
    ) -> AsyncIterator[Run]:
        pages = op.RunPages(filter, batch_size)  # arguments checked now, not at first anext()
        return self._iter_pages(pages)

    async def _iter_pages(self, pages: op.RunPages) -> AsyncIterator[Run]:
        while not pages.done:
            for run in await self._run(pages.next_page()):
                yield run

    async def count_runs(self, filter: RunFilter | None = None) -> dict[RunState, int]:
        return await self._run(op.count_runs(filter))

    async def has_active_workflow(self, workflow: str) -> bool:
        return await self._run(op.has_active_workflow(workflow))

    async def has_active_repo(self, repo: str) -> bool:
        return await self._run(op.has_active_repo(repo))

    async def sweep_retention(
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
        return [run_id async for batch in batches for run_id in batch]

    def sweep_retention_batches(
        self,
        older_than: datetime,
        *,
        batch_size: int = 1000,
        archive: Archive | None = None,
        target_batch_seconds: float | None = None,
    ) -> AsyncIterator[list[str]]:
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

    async def _sweep_batches(self, sweep: Sweep) -> AsyncIterator[list[str]]:
        try:
            while not sweep.done:
                batch = await self._run(op.sweep_batch(sweep))
                sweep.batch_committed()  # times the batch through its commit
                if batch:
                    yield batch
        finally:
            sweep.close()

    async def count_sweepable(self, older_than: datetime) -> int:
        return await self._run(op.count_sweepable(older_than))

    # --------------------------------------------------- node runtimes ---

    async def get_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        return await self._run(op.get_node_runtime(run_id, node))

    async def load_node_runtime(self, run_id: str, node: str) -> NodeRuntime:
        return await self._run(op.load_node_runtime(run_id, node))

    async def update_node_runtime(self, runtime: NodeRuntime) -> None:
        await self._run(op.update_node_runtime(runtime, self._now()))

    async def update_node_runtime_visit(self, run_id: str, node: str, visit_id: str) -> None:
        await self._run(op.update_node_runtime_visit(run_id, node, visit_id, self._now()))

    async def node_runtime_visit_is_current(self, run_id: str, node: str, visit_id: str) -> bool:
        return await self._run(op.node_runtime_visit_is_current(run_id, node, visit_id))

    async def replace_node_runtime(
        self,
        run_id: str,
        node: str,
        visit_id: str,
        terminal_id: str | None,
        previous_session_id: str | None,
        session_id: str | None,
    ) -> None:
        await self._run(
            op.replace_node_runtime(
                run_id, node, visit_id, terminal_id, previous_session_id, session_id, self._now()
            )
        )

    async def clear_node_runtime(
        self, run_id: str, node: str, *, clear_terminal: bool, clear_session: bool
    ) -> None:
        await self._run(
            op.clear_node_runtime(run_id, node, clear_terminal, clear_session, self._now())
        )

    async def list_node_runtimes(self, run_id: str) -> list[NodeRuntime]:
        return await self._run(op.list_node_runtimes(run_id))

    async def register_node_session(self, registration: NodeSessionRegistration) -> bool:
        return await self._run(op.register_node_session(registration, self._now()))

    # --------------------------------------------------------- reports ---

    async def has_processed_report(self, run_id: str, report_id: str) -> bool:
        return await self._run(op.has_processed_report(run_id, report_id))

    async def record_processed_report(self, run_id: str, visit_id: str, report_id: str) -> None:
        await self._run(op.record_processed_report(run_id, visit_id, report_id, self._now()))

    # -------------------------------------------------------- identity ---

    async def identity(self) -> ExecutorIdentity | None:
        return await self._run(op.identity())

    async def initialize_identity(self, identity: ExecutorIdentity) -> None:
        await self._run(op.initialize_identity(identity))

    async def verify_identity(self, identity: ExecutorIdentity) -> None:
        await self._run(op.verify_identity(identity))
