"""Child-process entry points of the reliability suite (multiprocessing, "spawn" context).

Children open the database exactly as an application does
(``open_projection`` / ``init_database_with_identity``), never with test
shortcuts, and report back through a JSON file or a queue. They never raise:
every exception is recorded as data so the parent can count and show it.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, cast

from relay_flow_projection import (
    ExecutorIdentity,
    NodeSessionRegistration,
    RetryStatus,
    RunProjection,
    RunStart,
    RunState,
    init_database_with_identity,
    open_async_projection,
    open_projection,
)

NON_TERMINAL = [
    RunState.STARTING,
    RunState.RUNNING,
    RunState.WAITING,
    RunState.BLOCKED,
    RunState.CANCELING,
]
ALL_STATES = [*NON_TERMINAL, RunState.COMPLETED, RunState.CANCELED]

# ------------------------------------------------------------ contention ---

# Reads are in the mix with their answers checked: through a transaction
# pooler a read may be sent on another server connection than the one its
# statement was prepared on, which fails or, worse, answers another query.
CONTENTION_MIX = (
    ("update_node", 3),
    ("register_node_session", 3),
    ("record_processed_report", 3),
    ("update_state", 1),
    ("get_run", 2),
    ("has_processed_report", 2),
)


@dataclass
class ThreadLog:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    reports: dict[str, list[str]] = field(default_factory=dict)  # report id -> [run, visit]
    visits: list[list[str]] = field(default_factory=list)  # [run, node, visit] written
    binds: int = 0


def _contention_thread(
    projection: RunProjection,
    name: str,
    seed: int,
    operations: int,
    run_ids: list[str],
    nodes: list[str],
    log: ThreadLog,
) -> None:
    rng = random.Random(seed)
    kinds = [kind for kind, _ in CONTENTION_MIX]
    weights = [weight for _, weight in CONTENTION_MIX]
    for index in range(operations):
        kind = rng.choices(kinds, weights)[0]
        run_id = rng.choice(run_ids)
        node = rng.choice(nodes)
        started = time.perf_counter()
        try:
            if kind == "update_node":
                visit = f"{name}-v{index}"
                projection.update_node(run_id, rng.choice(NON_TERMINAL), node, visit)
                log.visits.append([run_id, node, visit])
            elif kind == "register_node_session":
                registration = NodeSessionRegistration(run_id, node, f"{name}-s{index}")
                if projection.register_node_session(registration):
                    log.binds += 1
            elif kind == "record_processed_report":
                # Own namespace; now and then replay an earlier receipt (idempotence).
                if log.reports and rng.random() < 0.2:
                    report_id = rng.choice(sorted(log.reports))
                    run_id, visit = log.reports[report_id]
                else:
                    report_id = f"{name}-r{index}"
                    visit = f"{name}-rv{index}"
                projection.record_processed_report(run_id, visit, report_id)
                log.reports.setdefault(report_id, [run_id, visit])
            elif kind == "get_run":
                found = projection.get_run(run_id).id
                if found != run_id:
                    log.errors.append(f"get_run({run_id!r}) answered run {found!r}")
            elif kind == "has_processed_report":
                # One receipt this caller recorded (must be there), one it never did.
                checks = [(f"{name}-never-{index}", run_id, False)]
                if log.reports:
                    recorded = rng.choice(sorted(log.reports))
                    checks.append((recorded, log.reports[recorded][0], True))
                for report_id, receipt_run, expected in checks:
                    answer = projection.has_processed_report(receipt_run, report_id)
                    if answer is not expected:
                        log.errors.append(
                            f"has_processed_report({receipt_run!r}, {report_id!r}) "
                            f"answered {answer!r}"
                        )
            else:
                state = rng.choice(ALL_STATES)
                finished = datetime.now(UTC) if state.is_terminal else None
                projection.update_state(run_id, state, f"error from {name}", finished)
        except Exception:  # every error is data for the parent
            log.errors.append(f"{kind}: {traceback.format_exc(limit=3)}")
        finally:
            log.latencies.setdefault(kind, []).append(time.perf_counter() - started)


def contention_worker(
    target: str,
    worker: int,
    threads: int,
    operations: int,
    run_ids: list[str],
    nodes: list[str],
    seed: int,
    start: Event,
    result_path: str,
) -> None:
    """One process: *threads* threads sharing one RunProjection, *operations* calls each."""
    projection = open_projection(target)
    logs = [ThreadLog() for _ in range(threads)]
    workers = [
        threading.Thread(
            target=_contention_thread,
            args=(
                projection,
                f"p{worker}t{index}",
                seed * 1000 + worker * 10 + index,
                operations,
                run_ids,
                nodes,
                logs[index],
            ),
        )
        for index in range(threads)
    ]
    start.wait(timeout=120)
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    projection.engine.dispose()
    _write_merged(logs, result_path)


def async_contention_worker(
    target: str,
    engine_kwargs: dict[str, Any],
    sync_target: str,
    worker: int,
    tasks: int,
    operations: int,
    run_ids: list[str],
    nodes: list[str],
    seed: int,
    start: Event,
    result_path: str,
) -> None:
    """contention_worker on the asyncio facade: *tasks* concurrent calls on one event loop.

    The same per-caller logic (``_contention_thread``) drives an
    AsyncRunProjection through the blocking adapter, so each of the *tasks*
    callers has one coroutine in flight on the process's single event loop.
    """
    from async_adapter import BlockingAsyncProjection, LoopThread

    from relay_flow_projection import create_engine, open_async_projection

    loop = LoopThread()
    async_projection = loop.call(open_async_projection(target, **engine_kwargs))
    sync_engine = create_engine(sync_target)
    adapter = BlockingAsyncProjection(async_projection, loop, sync_engine)
    projection = cast(RunProjection, adapter)  # duck-typed: the same methods
    logs = [ThreadLog() for _ in range(tasks)]
    callers = [
        threading.Thread(
            target=_contention_thread,
            args=(
                projection,
                f"p{worker}a{index}",
                seed * 1000 + worker * 100 + index,
                operations,
                run_ids,
                nodes,
                logs[index],
            ),
        )
        for index in range(tasks)
    ]
    start.wait(timeout=120)
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    adapter.close()
    sync_engine.dispose()
    loop.stop()
    _write_merged(logs, result_path)


def _write_merged(logs: list[ThreadLog], result_path: str) -> None:
    merged: dict[str, Any] = {
        "latencies": {},
        "errors": [],
        "reports": {},
        "visits": [],
        "binds": 0,
    }
    for log in logs:
        for kind, values in log.latencies.items():
            merged["latencies"].setdefault(kind, []).extend(values)
        merged["errors"].extend(log.errors)
        merged["reports"].update(log.reports)
        merged["visits"].extend(log.visits)
        merged["binds"] += log.binds
    Path(result_path).write_text(json.dumps(merged), encoding="utf-8")


# --------------------------------------------------------------- crashes ---

CRASH_RUNS = [f"crash-run-{index}" for index in range(4)]
CRASH_NODES = ["plan", "build", "review"]
PAST = datetime(2020, 1, 1, tzinfo=UTC)


def crash_writer(target: str, seed: int, log_path: str, ready: Event) -> None:
    """Write in a loop until killed; append one line per committed call to *log_path*.

    Lines are written after the call returns (committed), so every logged
    effect must survive the SIGKILL that ends this process.
    """
    rng = random.Random(seed)
    projection = open_projection(target)
    with open(log_path, "a", encoding="utf-8") as log:
        index = 0
        while True:
            index += 1
            name = f"k{seed}-{index}"
            run_id = rng.choice(CRASH_RUNS)
            node = rng.choice(CRASH_NODES)
            choice = rng.randrange(8)
            record: dict[str, Any]
            if choice == 0:
                # A short-lived run: started, moved, finished long ago, swept.
                ephemeral = f"eph-{name}"
                projection.insert_start(RunStart(ephemeral, "repo", "wf", "T", name), PAST)
                projection.update_node(ephemeral, RunState.RUNNING, node, f"{name}-v")
                projection.record_processed_report(ephemeral, f"{name}-v", f"{name}-r")
                projection.update_state(ephemeral, RunState.COMPLETED, None, PAST)
                record = {"op": "ephemeral", "run": ephemeral}
            elif choice == 1:
                swept = projection.sweep_retention(PAST + timedelta(days=1), batch_size=3)
                record = {"op": "sweep", "runs": swept}
            elif choice in (2, 3):
                projection.update_node(run_id, rng.choice(NON_TERMINAL), node, f"{name}-v")
                record = {"op": "update_node", "run": run_id, "node": node, "visit": f"{name}-v"}
            elif choice == 4:
                bound = projection.register_node_session(
                    NodeSessionRegistration(run_id, node, f"{name}-s")
                )
                record = {"op": "session", "run": run_id, "node": node, "session": f"{name}-s"}
                record["bound"] = bound
            elif choice == 5:
                projection.record_processed_report(run_id, f"{name}-rv", f"{name}-r")
                record = {"op": "report", "run": run_id, "report": f"{name}-r"}
            elif choice == 6:
                projection.update_state(run_id, rng.choice(NON_TERMINAL), f"e{name}")
                record = {"op": "state", "run": run_id}
            else:
                status = RetryStatus(index, f"retry {name}", PAST)
                projection.update_retry(run_id, status if rng.random() < 0.7 else None)
                record = {"op": "retry", "run": run_id}
            log.write(json.dumps(record) + "\n")
            log.flush()
            ready.set()


# ------------------------------------------------------------- identity ---


def identity_racer(target: str, identity: tuple[str, str, str], barrier: Any) -> tuple[str, str]:
    """Wait for every racer, then initialize *target* with *identity*; return the outcome."""
    wanted = ExecutorIdentity(*identity)
    barrier.wait(timeout=120)
    try:
        init_database_with_identity(target, wanted)
    except Exception as exc:  # the outcome is data for the parent
        return type(exc).__name__, str(exc)
    return "ok", ""


def async_identity_racer(
    target: str, identity: tuple[str, str, str], barrier: Any
) -> tuple[str, str]:
    """identity_racer on the asyncio facade: open (running the chain), then initialize."""
    wanted = ExecutorIdentity(*identity)
    barrier.wait(timeout=120)

    async def race() -> None:
        async with await open_async_projection(target, upgrade=True) as projection:
            await projection.initialize_identity(wanted)

    try:
        asyncio.run(race())
    except Exception as exc:  # the outcome is data for the parent
        return type(exc).__name__, str(exc)
    return "ok", ""


# ------------------------------------------------------ open while busy ---


def bulk_writer(target: str, name: str, ready: Event, stop: Event) -> None:
    """Insert wide runs until *stop*: the WAL fills and checkpoints run all the time."""
    projection = open_projection(target)
    index = 0
    while not stop.is_set():
        index += 1
        start = RunStart(f"{name}-{index}", "repo" * 100, "wf", "T", "K" * 400)
        projection.insert_start(start, datetime.now(UTC))
        ready.set()
    projection.engine.dispose()
