"""Contention: 2 processes x 4 threads hammer shared runs of one database.

The mix is update_node, register_node_session, record_processed_report and
update_state on a handful of shared runs and nodes. No error may reach a
caller (on SQLite that means no "database is locked"), and afterwards the
projection is exactly what the calls imply: receipts counted one by one,
each run's current visit equal to its node runtime's visit, every bind made
under the visit its session was registered for (checked per bind by a
test-only audit trigger). Figures are printed: operations, errors, p99.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import text_of
from reliability_support import (
    SPAWN,
    audit_violations,
    install_runtime_audit,
    invariant_violations,
    percentile,
    scaled,
)
from reliability_workers import bulk_writer, contention_worker

from relay_flow_projection import (
    ProjectionError,
    RunProjection,
    RunStart,
    create_engine,
    init_database,
    open_projection,
)

PROCESSES = 2
THREADS = 4
RUNS = [f"shared-{index}" for index in range(4)]
NODES = ["plan", "code", "review"]


def _run_workers(target: str, operations: int, tmp_path: Path) -> list[dict[str, Any]]:
    start = SPAWN.Event()
    paths = [tmp_path / f"worker-{index}.json" for index in range(PROCESSES)]
    processes = [
        SPAWN.Process(
            target=contention_worker,
            args=(target, index, THREADS, operations, RUNS, NODES, 7, start, str(paths[index])),
        )
        for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(timeout=600)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths]


# PostgreSQL runs twice: directly and through a transaction-pooling PgBouncer.
@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
def test_contention_keeps_every_invariant(
    db_url: str, dialect: str, route: str, tmp_path: Path
) -> None:
    init_database(db_url)
    engine = create_engine(db_url)
    try:
        projection = RunProjection(engine)
        for run_id in RUNS:
            projection.insert_start(RunStart(run_id, "repo", "wf", "T", run_id), datetime.now(UTC))
        install_runtime_audit(engine)

        operations = scaled(400)
        results = _run_workers(db_url, operations, tmp_path)

        errors = [error for result in results for error in result["errors"]]
        latencies: dict[str, list[float]] = {}
        for result in results:
            for kind, values in result["latencies"].items():
                latencies.setdefault(kind, []).extend(values)
        every = [value for values in latencies.values() for value in values]
        reports: dict[str, list[str]] = {}
        for result in results:
            reports.update(result["reports"])
        binds = sum(result["binds"] for result in results)

        with engine.connect() as connection:
            problems = invariant_violations(connection)
            changes, audited_binds, audit_problems = audit_violations(connection)
            receipts = {
                text_of(row[0]): [text_of(row[1]), text_of(row[2])]
                for row in connection.execute(
                    sa.text("SELECT report_id, run_id, node_visit_id FROM relay_processed_reports")
                )
            }

        by_kind = ", ".join(f"{kind} {len(values)}" for kind, values in sorted(latencies.items()))
        print(
            f"\ncontention[{dialect}, {route}]: {PROCESSES} processes x {THREADS} threads, "
            f"{len(every)} operations ({by_kind}), {len(errors)} errors, "
            f"p50 {percentile(every, 0.50) * 1000:.1f} ms, "
            f"p99 {percentile(every, 0.99) * 1000:.1f} ms, "
            f"max {max(every) * 1000:.1f} ms; {len(receipts)} receipts, "
            f"{binds} binds, {changes} runtime changes audited"
        )
        assert errors == []
        assert len(every) == PROCESSES * THREADS * operations
        assert problems == []
        assert audit_problems == []
        # Exact receipts: one per distinct report id any caller recorded, under
        # the run and visit of its first recording.
        assert receipts == reports
        assert audited_binds == binds
        for report_id, (run_id, _visit) in reports.items():
            assert projection.has_processed_report(run_id, report_id)
    finally:
        engine.dispose()


@pytest.mark.sqlite_only
def test_opening_while_others_write(sqlite_path: Path) -> None:
    """Workers (re)start while others write: opening never mistakes a busy file for a bad one.

    Found here: the file check judged a live WAL database by its main file's
    size, which another process's checkpoint leaves short of the header's page
    count for a moment; before the fix 689 of 1,000 opens failed with
    NotAProjectionDatabase ("truncated or damaged").
    """
    init_database(sqlite_path)
    stop = SPAWN.Event()
    ready = [SPAWN.Event() for _ in range(PROCESSES)]
    writers = [
        SPAWN.Process(target=bulk_writer, args=(str(sqlite_path), f"w{index}", ready[index], stop))
        for index in range(PROCESSES)
    ]
    for writer in writers:
        writer.start()
    failures: list[str] = []
    opens = scaled(100)
    try:
        for event in ready:
            assert event.wait(timeout=60)
        for _ in range(opens):
            try:
                projection = open_projection(sqlite_path)
                projection.count_runs()
                projection.engine.dispose()
            except ProjectionError as exc:
                failures.append(str(exc))
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=60)
    print(f"\nopen while writing[sqlite]: {opens} opens, {len(failures)} failures")
    assert [writer.exitcode for writer in writers] == [0] * PROCESSES
    assert failures == []
