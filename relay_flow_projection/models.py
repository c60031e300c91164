"""Value types crossing the public API: plain frozen, slotted dataclasses."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class RunState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    CANCELING = "canceling"
    CANCELED = "canceled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[RunState] = frozenset({RunState.COMPLETED, RunState.CANCELED})


@dataclass(frozen=True, slots=True)
class RunStart:
    """What the engine knows when a run attempt starts."""

    id: str
    repo: str
    workflow: str
    ticket_id: str
    ticket_key: str
    logical_id: str = ""  # "" means: same as id
    attempt_id: int = 0  # 0 means: attempt 1


@dataclass(frozen=True, slots=True)
class RetryStatus:
    attempt: int
    last_error: str
    next_retry_at: datetime


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    logical_id: str
    attempt_id: int
    repo: str
    workflow: str
    ticket_id: str
    ticket_key: str
    state: RunState
    current_node: str | None
    current_node_visit_id: str | None
    last_error: str | None
    retry: RetryStatus | None
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class NodeRuntime:
    run_id: str
    node: str
    terminal_id: str | None = None
    session_id: str | None = None
    node_visit_id: str | None = None  # None only in the empty binding of load_node_runtime
    updated_at: datetime | None = None  # None only in the empty binding


@dataclass(frozen=True, slots=True)
class RunFilter:
    """None means "any"."""

    repo: str | None = None
    workflow: str | None = None
    ticket: str | None = None  # matches ticket_key
    active: bool | None = None  # True: not terminal; False: terminal


@dataclass(frozen=True, slots=True)
class NodeSessionRegistration:
    run_id: str
    node: str
    session_id: str


@dataclass(frozen=True, slots=True)
class ExecutorIdentity:
    executor_plugin: str  # "goworkflows" or "temporal"
    temporal_address: str = ""
    temporal_namespace: str = ""
