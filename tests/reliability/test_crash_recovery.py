"""Crashes: a SQLite writer is SIGKILLed at random moments, again and again.

A child process writes in a loop (update_node, sessions, receipts, states,
retries, short-lived runs that are finished and swept in batches) and logs
each call after it returns. The parent kills it at a random instant (seeded),
then checks, every time:

- the next ``open_projection`` works as is: no repair, no upgrade;
- ``PRAGMA integrity_check`` is ``ok`` and ``PRAGMA foreign_key_check`` empty;
- no update_node is half-applied (a run's current visit is its node
  runtime's visit) and no sweep left orphans (invariant_violations);
- every call the child saw return is still there (durability of commits).

SQLite only by nature: PostgreSQL's crash safety is the server's own.
"""

from __future__ import annotations

import json
import random
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from reliability_support import SPAWN, invariant_violations, scaled
from reliability_workers import CRASH_RUNS, crash_writer

from relay_flow_projection import RunProjection, RunStart, init_database, open_projection

pytestmark = pytest.mark.sqlite_only


def _committed_calls(log_path: Path) -> list[dict[str, Any]]:
    """The calls the killed children saw return (a torn last line is ignored)."""
    calls = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            calls.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the kill landed while this line was being written
    return calls


def _check_after_kill(path: Path, log_path: Path) -> list[str]:
    problems: list[str] = []
    projection = open_projection(path)  # no upgrade=True: must be usable as is
    try:
        with projection.engine.connect() as connection:
            problems += invariant_violations(connection)
            integrity = connection.exec_driver_sql("PRAGMA integrity_check").scalars().all()
            if integrity != ["ok"]:
                problems.append(f"integrity_check: {integrity}")
            orphans = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if orphans:
                problems.append(f"foreign_key_check: {orphans}")
            sessions = {
                tuple(row)
                for row in connection.execute(
                    sa.text("SELECT run_id, node, session_id FROM relay_node_sessions")
                )
            }
        present = {run.id for run in projection.iter_runs()}
        for call in _committed_calls(log_path):
            op = call["op"]
            if op == "report" and not projection.has_processed_report(call["run"], call["report"]):
                problems.append(f"lost committed receipt {call}")
            elif op == "session" and (call["run"], call["node"], call["session"]) not in sessions:
                if call["bound"]:
                    problems.append(f"lost committed session {call}")
            elif op == "ephemeral" and call["run"] in present:
                # Absent is fine: a sweep may have committed batches before its kill.
                if not projection.get_run(call["run"]).state.is_terminal:
                    problems.append(f"lost committed state of {call}")
            elif op == "sweep" and present.intersection(call["runs"]):
                problems.append(f"swept runs are back: {present.intersection(call['runs'])}")
        # The database takes writes again right away.
        projection.update_state(CRASH_RUNS[0], "running", None)
    finally:
        projection.engine.dispose()
    return problems


def test_sigkilled_writer_never_corrupts(sqlite_path: Path, tmp_path: Path) -> None:
    init_database(sqlite_path)
    projection = open_projection(sqlite_path)
    for run_id in CRASH_RUNS:
        projection.insert_start(RunStart(run_id, "repo", "wf", "T", run_id), datetime.now(UTC))
    projection.engine.dispose()

    kills = scaled(30, minimum=20)
    rng = random.Random(20260301)
    log_path = tmp_path / "committed.jsonl"
    log_path.touch()
    committed_before = 0
    for kill in range(kills):
        ready = SPAWN.Event()
        child = SPAWN.Process(
            target=crash_writer, args=(str(sqlite_path), kill, str(log_path), ready)
        )
        child.start()
        assert ready.wait(timeout=60), "the writer never committed a first call"
        child.join(timeout=rng.uniform(0.0, 0.25))
        assert child.is_alive(), f"the writer died by itself (exit code {child.exitcode})"
        child.kill()  # SIGKILL
        child.join()
        assert child.exitcode == -9
        problems = _check_after_kill(sqlite_path, log_path)
        assert problems == [], f"after kill {kill + 1}: {problems}"
        committed = len(_committed_calls(log_path))
        assert committed > committed_before
        committed_before = committed

    with sqlite3.connect(sqlite_path) as connection:
        runs = connection.execute("SELECT count(*) FROM relay_runs").fetchone()[0]
    print(
        f"\ncrashes[sqlite]: {kills} SIGKILLs survived, {committed_before} committed calls "
        f"verified after each, {runs} runs in the database, 0 integrity errors"
    )
    projection = RunProjection(sa.create_engine(f"sqlite:///{sqlite_path}"))
    assert {run.id for run in projection.list_runs()} >= set(CRASH_RUNS)
    projection.engine.dispose()
