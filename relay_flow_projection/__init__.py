"""relay_flow_projection: the SQL run projection of relay-flow (see API.md).

The errors and models are imported with the package (they need nothing but
the standard library). The names that need SQLAlchemy or Alembic (the
repositories, the engine factories and the database functions) are imported
on first use through a module-level ``__getattr__`` (PEP 562): the operator
command line starts without them (``relay-flow-projection --help`` in well
under 0.3 s) and ``from relay_flow_projection import RunProjection`` works
exactly as before. The ``TYPE_CHECKING`` imports give type checkers the same
names statically.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    ExtraNotInstalled,
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

if TYPE_CHECKING:
    from .async_repository import AsyncRunProjection
    from .database import (
        has_nonterminal_runs,
        init_database,
        init_database_with_identity,
        open_async_projection,
        open_projection,
        upgrade,
    )
    from .engine import create_async_engine, create_engine
    from .repository import RunProjection

# Public name -> the submodule defining it, imported when the name is first used.
_LAZY: dict[str, str] = {
    "AsyncRunProjection": "async_repository",
    "RunProjection": "repository",
    "create_async_engine": "engine",
    "create_engine": "engine",
    "has_nonterminal_runs": "database",
    "init_database": "database",
    "init_database_with_identity": "database",
    "open_async_projection": "database",
    "open_projection": "database",
    "upgrade": "database",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    # Cached as a module attribute: later look-ups do not come back here.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "TERMINAL_STATES",
    "AsyncRunProjection",
    "DatabaseBusy",
    "DatabaseUnavailable",
    "ExecutorIdentity",
    "ExtraNotInstalled",
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
