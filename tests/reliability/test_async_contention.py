"""Contention on the asyncio facade: 2 processes x 32 concurrent calls on one event loop each.

The same mix and checks as test_contention.py (which runs the sync facade with
threads): no error reaches a caller, receipts are exact, every run's current
visit equals its node runtime's visit, and every bind was made under the
visit its session was registered for.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import async_target, text_of
from reliability_support import (
    SPAWN,
    audit_violations,
    install_runtime_audit,
    invariant_violations,
    percentile,
    scaled,
)
from reliability_workers import async_contention_worker

from relay_flow_projection import RunProjection, RunStart, create_engine

PROCESSES = 2
TASKS = 32
RUNS = [f"shared-{index}" for index in range(4)]
NODES = ["plan", "code", "review"]


@pytest.mark.parametrize("facade", ["async", "asyncpg"], indirect=True)
@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
def test_async_contention_keeps_every_invariant(
    migrated_url: str, dialect: str, facade: str, route: str, tmp_path: Path
) -> None:
    target, engine_kwargs = async_target(migrated_url, facade)
    engine = create_engine(migrated_url)
    try:
        projection = RunProjection(engine)
        for run_id in RUNS:
            projection.insert_start(RunStart(run_id, "repo", "wf", "T", run_id), datetime.now(UTC))
        install_runtime_audit(engine)
        operations = scaled(40)
        start = SPAWN.Event()
        paths = [tmp_path / f"worker-{index}.json" for index in range(PROCESSES)]
        processes = [
            SPAWN.Process(
                target=async_contention_worker,
                args=(
                    target,
                    engine_kwargs,
                    migrated_url,
                    index,
                    TASKS,
                    operations,
                    RUNS,
                    NODES,
                    11,
                    start,
                    str(paths[index]),
                ),
            )
            for index in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        start.set()
        for process in processes:
            process.join(timeout=600)
            if process.is_alive():
                process.kill()
                process.join()
        assert [process.exitcode for process in processes] == [0] * PROCESSES
        results: list[dict[str, Any]] = [json.loads(path.read_text()) for path in paths]

        errors = [error for result in results for error in result["errors"]]
        every = [v for r in results for values in r["latencies"].values() for v in values]
        reports: dict[str, list[str]] = {}
        for result in results:
            reports.update(result["reports"])
        binds = sum(result["binds"] for result in results)
        with engine.connect() as connection:
            problems = invariant_violations(connection)
            _changes, audited_binds, audit_problems = audit_violations(connection)
            receipts = {
                text_of(row[0]): [text_of(row[1]), text_of(row[2])]
                for row in connection.execute(
                    sa.text("SELECT report_id, run_id, node_visit_id FROM relay_processed_reports")
                )
            }
        print(
            f"\nasync contention[{dialect}-{facade}, {route}]: "
            f"{PROCESSES} processes x {TASKS} tasks, "
            f"{len(every)} operations, {len(errors)} errors, "
            f"p50 {percentile(every, 0.50) * 1000:.1f} ms, "
            f"p99 {percentile(every, 0.99) * 1000:.1f} ms; {len(receipts)} receipts, {binds} binds"
        )
        assert errors == []
        assert len(every) == PROCESSES * TASKS * operations
        assert problems == []
        assert audit_problems == []
        assert receipts == reports
        assert audited_binds == binds
    finally:
        engine.dispose()
