"""Writers keep flowing while retention sweeps (issue 13).

Four threads update active runs while a sweep deletes tens of thousands of
old runs in time-sized batches. No writer may fail, and no writer may wait
longer than about one batch holds the write lock (SQLite) or its row locks
(PostgreSQL):

- the sweep's batches hold their locks for about its target
  (``DEFAULT_TARGET_BATCH_SECONDS``, 75 ms): the median batch within it --
  timed from its ``BEGIN`` to the end of its ``COMMIT`` (benchmarks/lock_holds.py,
  the benchmark's own measure), through engine events in the sweeping thread, so the commit and
  any WAL checkpoint count and the time the sweep spent queued behind writers
  does not. The longest batch is printed, not asserted: one batch caught by a
  stall of the machine (2 CPUs shared with the other test worker and the
  server) took 296 ms here once; the sizing's bound of twice the target is
  tested with simulated costs in test_retention_batches.py and measured by
  benchmarks/run.py;
- the writers' p99 latency during the sweep stays under the target plus
  their own normal p99 (measured just before, with the same four writers).

A writer queued behind a batch waits for the rest of it and for the writers
ahead of it, so its p99 is about the longest batch plus a normal write: the
sweep sizes its batches for 70% of the target to leave room for the batches
that take longer than planned. The bounds are relative to the target and to
this run's own baseline, not fixed speeds; a sweep that holds the lock
longer fails them. Checked by hand with ``target_batch_seconds=60,
batch_size=40_000`` (batches doubling up to ~25,000 runs): on SQLite the
writers' p99 was 188 ms against a bound of 131 ms; on PostgreSQL, where the
writers' updates of active runs never wait for the sweep's row locks, the
longest batch held its locks 694 ms against 200 ms.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from conftest import load_benchmark_module
from reliability_support import percentile, scaled

from relay_flow_projection import RunProjection, RunStart, RunState, create_engine, upgrade
from relay_flow_projection.retention import DEFAULT_TARGET_BATCH_SECONDS
from relay_flow_projection.schema import node_runtime, node_sessions, processed_reports, runs

OLD = datetime(2025, 1, 1, tzinfo=UTC)
WRITERS = 4
ACTIVE_PER_WRITER = 10
# Slack for thread scheduling on a busy 2-CPU machine (five threads, one GIL).
SCHEDULING_SLACK = 0.05
LockHolds = load_benchmark_module("lock_holds").LockHolds


def _load_old_runs(engine: sa.Engine, count: int) -> None:
    """*count* completed runs finished long ago, three child rows each, in bulk."""
    for start in range(0, count, 5000):
        ids = [f"old-{index:07d}" for index in range(start, min(count, start + 5000))]
        when = OLD
        with engine.begin() as connection:
            connection.execute(
                runs.insert(),
                [
                    {
                        "id": run_id, "logical_run_id": run_id, "attempt_id": 1,
                        "repo": "r", "workflow": "w", "ticket_id": "t", "ticket_key": run_id,
                        "state": "completed", "started_at": when, "updated_at": when,
                        "finished_at": when,
                    }
                    for run_id in ids
                ],
            )  # fmt: skip
            connection.execute(
                node_runtime.insert(),
                [{"run_id": i, "node": "n", "node_visit_id": "v", "updated_at": when} for i in ids],
            )
            connection.execute(
                processed_reports.insert(),
                [{"run_id": i, "report_id": "p", "node_visit_id": "v", "created_at": when}
                 for i in ids],
            )  # fmt: skip
            connection.execute(
                node_sessions.insert(),
                [{"run_id": i, "node": "n", "session_id": "s", "node_visit_id": "v",
                  "created_at": when} for i in ids],
            )  # fmt: skip


def test_writers_keep_flowing_during_a_sweep(db_url: str, dialect: str, tmp_path: Path) -> None:
    upgrade(db_url)
    engine = create_engine(db_url, pool_size=WRITERS + 2)
    projection = RunProjection(engine)
    try:
        old = scaled(40_000)
        _load_old_runs(engine, old)
        now = datetime.now(UTC)
        active = [f"live-{w}-{i}" for w in range(WRITERS) for i in range(ACTIVE_PER_WRITER)]
        for run_id in active:
            projection.insert_start(RunStart(run_id, "r", "w", "t", run_id), now)

        phase = {"name": "baseline"}
        latencies: dict[str, list[float]] = {"baseline": [], "sweep": []}
        errors: list[str] = []
        stop = threading.Event()
        record = threading.Lock()

        def write(writer: int) -> None:
            mine = active[writer * ACTIVE_PER_WRITER : (writer + 1) * ACTIVE_PER_WRITER]
            step = 0
            while not stop.is_set():
                run_id = mine[step % len(mine)]
                started = time.perf_counter()
                try:
                    projection.update_node(run_id, RunState.RUNNING, f"n{step % 3}", f"v{step}")
                except Exception as exc:
                    errors.append(f"{run_id}: {type(exc).__name__}: {exc}")
                elapsed = time.perf_counter() - started
                with record:
                    latencies[phase["name"]].append(elapsed)
                step += 1

        # Listeners are added before the writers start: SQLAlchemy's listener
        # collections must not change while other threads dispatch events
        # ("deque mutated during iteration" in a writer, seen once).
        holds = LockHolds(engine, threading.get_ident())
        threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)
            phase["name"] = "sweep"
            batches = swept = 0
            sweep_started = time.perf_counter()
            for batch in projection.sweep_retention_batches(
                now - timedelta(days=30), batch_size=5000
            ):
                batches += 1
                swept += len(batch)
            sweep_seconds = time.perf_counter() - sweep_started
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)

        assert errors == []
        assert swept == old
        with engine.connect() as connection:
            assert connection.execute(sa.select(sa.func.count()).select_from(runs)).scalar() == len(
                active
            )
        baseline_p99 = percentile(latencies["baseline"], 0.99)
        during_p99 = percentile(latencies["sweep"], 0.99)
        longest_hold = max(holds.seconds)
        median_hold = percentile(holds.seconds, 0.5)
        print(
            f"\nsweep with writers [{dialect}]: {swept} runs in {batches} batches, "
            f"{sweep_seconds:.2f} s, batches held {median_hold * 1000:.1f} ms (median), "
            f"{longest_hold * 1000:.1f} ms (longest) "
            f"(target {DEFAULT_TARGET_BATCH_SECONDS * 1000:g} ms); writers: "
            f"{len(latencies['baseline'])} writes before (p99 {baseline_p99 * 1000:.1f} ms), "
            f"{len(latencies['sweep'])} during (p99 {during_p99 * 1000:.1f} ms), 0 errors"
        )
        # Writers got through during the sweep, not only after it.
        assert len(latencies["sweep"]) >= batches
        # Batches were sized for the target ...
        assert len(holds.seconds) >= batches
        assert median_hold <= DEFAULT_TARGET_BATCH_SECONDS + SCHEDULING_SLACK
        # ... and writers waited no longer than the target and a normal write.
        assert during_p99 <= DEFAULT_TARGET_BATCH_SECONDS + baseline_p99 + SCHEDULING_SLACK
    finally:
        engine.dispose()
