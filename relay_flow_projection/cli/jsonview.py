"""The ``--json`` shapes: stable keys, ISO-8601 UTC times ending in ``Z``.

Every key listed here is documented in the README's "Command line" section;
keys are never removed or renamed, only added.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from ..models import ExecutorIdentity, NodeRuntime, Run, RunState

JsonObject = dict[str, Any]


def iso(value: datetime | None) -> str | None:
    """``2026-03-01T12:00:00.123456Z``: always UTC, always six fraction digits."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def run_json(run: Run) -> JsonObject:
    return {
        "id": run.id,
        "logical_id": run.logical_id,
        "attempt_id": run.attempt_id,
        "repo": run.repo,
        "workflow": run.workflow,
        "ticket_id": run.ticket_id,
        "ticket_key": run.ticket_key,
        "state": run.state.value,
        "terminal": run.state.is_terminal,
        "current_node": run.current_node,
        "current_node_visit_id": run.current_node_visit_id,
        "last_error": run.last_error,
        "retry": None
        if run.retry is None
        else {
            "attempt": run.retry.attempt,
            "last_error": run.retry.last_error,
            "next_retry_at": iso(run.retry.next_retry_at),
        },
        "started_at": iso(run.started_at),
        "updated_at": iso(run.updated_at),
        "finished_at": iso(run.finished_at),
    }


def node_runtime_json(runtime: NodeRuntime) -> JsonObject:
    return {
        "node": runtime.node,
        "node_visit_id": runtime.node_visit_id,
        "terminal_id": runtime.terminal_id,
        "session_id": runtime.session_id,
        "updated_at": iso(runtime.updated_at),
    }


def identity_json(identity: ExecutorIdentity | None) -> JsonObject | None:
    if identity is None:
        return None
    return {
        "executor_plugin": identity.executor_plugin,
        "temporal_address": identity.temporal_address or None,
        "temporal_namespace": identity.temporal_namespace or None,
    }


def state_counts_json(counts: dict[RunState, int]) -> dict[str, int]:
    """Every state, in lifecycle order, zero when no run is in it."""
    return {state.value: counts.get(state, 0) for state in RunState}


def echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))
