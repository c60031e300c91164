"""relay_flow_projection: the SQL run projection of relay-flow (see API.md)."""

from .database import (
    has_nonterminal_runs,
    init_database,
    init_database_with_identity,
    open_projection,
    upgrade,
)
from .engine import create_engine
from .errors import (
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

__all__ = [
    "TERMINAL_STATES",
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
    "create_engine",
    "has_nonterminal_runs",
    "init_database",
    "init_database_with_identity",
    "open_projection",
    "upgrade",
]
