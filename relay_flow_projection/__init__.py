"""relay_flow_projection: the SQL run projection of relay-flow (see API.md)."""

from typing import TYPE_CHECKING, Any

from .database import (
    has_nonterminal_runs,
    init_database,
    init_database_with_identity,
    open_async_projection,
    open_projection,
    upgrade,
)
from .engine import create_async_engine, create_engine
from .errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    IdentityMismatch,
    IdentityMissing,
    InvalidIdentity,
    NodeRuntimeNotFound,
    NodeVisitNotCurrent,
    NotAProjectionDatabase,
    ProjectionError,
    RunNotFound,
    SchemaOutOfDate,
)
from .models import (
    TERMINAL_STATES,
    ExecutorIdentity,
    NodeRuntime,
    NodeSessionRegistration,
    RetryStatus,
    Run,
    RunFilter,
    RunStart,
    RunState,
)
from .repository import RunProjection

if TYPE_CHECKING:
    from .async_repository import AsyncRunProjection


def __getattr__(name: str) -> Any:
    # The asyncio facade loads SQLAlchemy's asyncio extension: only when asked for.
    if name == "AsyncRunProjection":
        from .async_repository import AsyncRunProjection

        return AsyncRunProjection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TERMINAL_STATES",
    "AsyncRunProjection",
    "DatabaseBusy",
    "DatabaseUnavailable",
    "ExecutorIdentity",
    "IdentityMismatch",
    "IdentityMissing",
    "InvalidIdentity",
    "NodeRuntime",
    "NodeRuntimeNotFound",
    "NodeSessionRegistration",
    "NodeVisitNotCurrent",
    "NotAProjectionDatabase",
    "ProjectionError",
    "RetryStatus",
    "Run",
    "RunFilter",
    "RunNotFound",
    "RunProjection",
    "RunStart",
    "RunState",
    "SchemaOutOfDate",
    "create_async_engine",
    "create_engine",
    "has_nonterminal_runs",
    "init_database",
    "init_database_with_identity",
    "open_async_projection",
    "open_projection",
    "upgrade",
]
