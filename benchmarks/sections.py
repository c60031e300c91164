"""The measured sections. Each runs in a child process of its own (see ``child.py``).

Every function takes a :class:`Target` (a fresh database prepared by the parent)
and returns a JSON-able dict of measurements.
"""

from __future__ import annotations

import functools
import itertools
import os
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeSessionRegistration,
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
    create_engine,
)

from .bare_core import BareCore
from .dataset import Shape, run_id
from .raw import (
    TRANSACTION_CONTROL,
    RawDriver,
    RawPostgres,
    RawSQLite,
    verify_same_sql,
)


@dataclass(frozen=True, slots=True)
class Target:
    dialect: str  # "sqlite" or "postgresql"
    url: str  # what create_engine() takes: a file path or a URL
    conninfo: str  # sqlite3 path or libpq connection string

    def raw(self) -> RawDriver:
        if self.dialect == "sqlite":
            return RawSQLite(self.conninfo)
        return RawPostgres(self.conninfo)


def _us(nanoseconds: float) -> float:
    return nanoseconds / 1000.0


def proc_status_kib(field: str, pid: int | str = "self") -> int:
    """A memory field of /proc/<pid>/status (VmRSS: now, VmHWM: peak), in KiB.

    VmHWM is the peak of this process image only. ``ru_maxrss`` is not used: on
    Linux it carries the parent's resident size across fork and exec, so every
    child of a large parent would report the parent's peak.
    """
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


# ------------------------------------------------------ 1. per operation ---


def _alternate(
    rounds: int, block: int, layer: Callable[[int], object], raw: Callable[[int], object]
) -> dict[str, float]:
    """Median µs/op of *layer* and *raw*, measured in alternating blocks of *block* calls."""
    measured = alternate_many(rounds, block, {"layer": layer, "raw": raw})
    return {key: measured[key] for key in ("layer_us", "raw_us", "ratio")}


def alternate_many(
    rounds: int, block: int, contenders: dict[str, Callable[[int], object]]
) -> dict[str, Any]:
    """Median µs/op of each contender, measured in blocks of *block* calls that take
    turns: each round starts one contender later (layer, bare, raw; bare, raw, layer; ...).

    Returns ``<name>_us`` (the median), ``<name>_range`` ([fastest, slowest] block),
    ``ratio`` (layer / raw) and ``bare_ratio`` (layer / bare) where those exist.
    """
    counter = itertools.count()
    for op in contenders.values():  # warm caches, compiled statements, prepared statements
        for _ in range(max(block // 5, 5)):
            op(next(counter))
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            op = contenders[name]
            started = time.perf_counter_ns()
            for _ in range(block):
                op(next(counter))
            times[name].append(_us((time.perf_counter_ns() - started) / block))
    return summarize(times)


def summarize(times: dict[str, list[float]]) -> dict[str, Any]:
    """Medians, ranges and the two ratios of per-block µs/op samples."""
    result: dict[str, Any] = {}
    for name, samples in times.items():
        result[f"{name}_us"] = statistics.median(samples)
        result[f"{name}_range"] = [min(samples), max(samples)]
    if "layer_us" in result and "raw_us" in result:
        result["ratio"] = result["layer_us"] / result["raw_us"]
    if "layer_us" in result and "bare_us" in result:
        result["bare_ratio"] = result["layer_us"] / result["bare_us"]
    return result


def operations(
    target: Target, runs: int, rounds: int, block: int, write_block: int, write_rounds: int
) -> dict[str, Any]:
    shape = Shape(runs)
    engine = create_engine(target.url)
    projection = RunProjection(engine)
    raw = target.raw()
    active = [run_id(i) for i in shape.active_indexes()]
    now = datetime.now(UTC)

    def start(k: int) -> RunStart:
        return RunStart(f"new-{k:09d}", "repo-1", "workflow-7", f"T-n{k}", f"KEY-n{k}")

    def registration(k: int) -> NodeSessionRegistration:
        return NodeSessionRegistration(run_id((k * 104_729) % runs), "build", f"s-{k}")

    # The layer must send exactly what the raw baseline and the bare-Core floor
    # (bare_core.py) send (same inputs, same clock).
    one = registration(-1)
    bare = BareCore(target.url)
    for baseline in (raw, bare):
        verify_same_sql(
            engine,
            baseline,
            lambda p: p.insert_start(start(-1), now),
            lambda b: b.insert_start(start(-1), now),
        )
        verify_same_sql(
            engine,
            baseline,
            lambda p: p.update_node(active[0], RunState.RUNNING, "build", "v"),
            lambda b: b.update_node(active[0], RunState.RUNNING, "build", "v"),
        )
        verify_same_sql(
            engine, baseline, lambda p: p.get_run(active[0]), lambda b: b.get_run(active[0])
        )
        verify_same_sql(
            engine,
            baseline,
            lambda p: p.register_node_session(one),
            lambda b: b.register_node_session(one),
        )
    if raw.get_run(active[0]) != projection.get_run(active[0]):
        raise AssertionError("the raw mapping differs from the layer's")
    # PostgreSQL: psycopg's own default (prepare_threshold=5) beside the raw driver
    # with the layer's setting, for what the pooler-safe default costs by itself.
    sides: dict[str, Any] = {"layer": projection, "bare": bare, "raw": raw}
    if target.dialect == "postgresql":
        sides["raw_prepared"] = RawPostgres(target.conninfo, prepare_threshold=5)

    def each(call: Callable[[Any, int], object]) -> dict[str, Callable[[int], object]]:
        return {name: functools.partial(call, side) for name, side in sides.items()}

    results: dict[str, Any] = {}
    results["insert_start"] = alternate_many(
        write_rounds, write_block, each(lambda s, k: s.insert_start(start(k), datetime.now(UTC)))
    )
    results["update_node"] = alternate_many(
        write_rounds,
        write_block,
        each(
            lambda s, k: s.update_node(active[k % len(active)], RunState.RUNNING, "build", f"v-{k}")
        ),
    )
    results["get_run"] = alternate_many(
        rounds, block, each(lambda s, k: s.get_run(run_id((k * 7_919) % runs)))
    )
    results["register_node_session"] = alternate_many(
        write_rounds, write_block, each(lambda s, k: s.register_node_session(registration(k)))
    )
    for side in sides.values():
        if side is not projection:
            side.close()
    engine.dispose()
    return results


def concurrency(target: Target, threads: int, iterations: int) -> dict[str, Any]:
    """*threads* threads updating the same 4 runs through one engine; counts every error."""
    engine = create_engine(target.url)
    projection = RunProjection(engine)
    shared = [f"shared-{n}" for n in range(4)]
    for rid in shared:
        projection.insert_start(RunStart(rid, "repo", "wf", rid, rid), datetime.now(UTC))
        projection.update_node(rid, RunState.RUNNING, "build", "visit-0")
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def worker(number: int) -> None:
        barrier.wait()
        for k in range(iterations):
            rid = shared[(number + k) % len(shared)]
            try:
                projection.update_node(rid, RunState.RUNNING, "build", f"visit-{number}-{k}")
                projection.register_node_session(
                    NodeSessionRegistration(rid, "build", f"session-{number}-{k}")
                )
                projection.update_state(rid, RunState.WAITING)
                projection.get_run(rid)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    elapsed = time.perf_counter() - started
    engine.dispose()
    calls = threads * iterations * 4
    return {
        "threads": threads,
        "calls": calls,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "calls_per_s": calls / elapsed,
    }


# ---------------------------------------------------------- 2. listings ---


def _median_ms(call: Callable[[], object], repeat: int) -> float:
    call()
    call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return statistics.median(samples)


def _captured(engine: Engine, call: Callable[[], object]) -> tuple[str, Any]:
    seen: list[tuple[str, Any]] = []

    def record(*args: Any) -> None:
        if args[2] not in TRANSACTION_CONTROL:
            seen.append((args[2], args[3]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen[0]


def query_plan(engine: Engine, target: Target, call: Callable[[], object]) -> str:
    """The plan of the statement *call* sends, in one line."""
    statement, parameters = _captured(engine, call)
    if target.dialect == "sqlite":
        connection = sqlite3.connect(target.conninfo)
        try:
            rows = connection.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
        finally:
            connection.close()
        return "; ".join(str(row[3]) for row in rows)
    with psycopg.connect(target.conninfo, autocommit=True) as pg:
        rows = pg.execute(("EXPLAIN (COSTS OFF) " + statement).encode(), parameters).fetchall()
    return "; ".join(str(row[0]).strip().lstrip("-> ").strip() for row in rows)


def listings(target: Target, runs: int, repeat: int) -> dict[str, Any]:
    shape = Shape(runs)
    engine = create_engine(target.url)
    projection = RunProjection(engine)
    raw = target.raw()
    hot = shape.workflow_of(42)
    active_filter = RunFilter(workflow=hot, active=True)

    def list_active() -> list[Any]:
        return projection.list_runs(active_filter)

    verify_same_sql(
        engine, raw, lambda p: p.list_runs(active_filter), lambda r: r.list_active_workflow(hot)
    )
    listed = list_active()
    if listed != raw.list_active_workflow(hot):
        raise AssertionError("raw and layer listings differ")
    results: dict[str, Any] = {"active_rows": len(listed)}
    results["list_active_ms"] = _median_ms(list_active, repeat)
    results["list_active_raw_ms"] = _median_ms(lambda: raw.list_active_workflow(hot), repeat)
    results["list_active_plan"] = query_plan(engine, target, list_active)
    if target.dialect == "sqlite":
        # The probe's plain (workflow, state) index with bound terminal states, for contrast.
        connection = sqlite3.connect(target.conninfo)
        contrast = (
            "SELECT * FROM relay_runs INDEXED BY relay_runs_workflow_state "
            "WHERE workflow = ? AND state NOT IN (?, ?) ORDER BY started_at, id"
        )
        results["list_plain_index_ms"] = _median_ms(
            lambda: connection.execute(contrast, (hot, "canceled", "completed")).fetchall(),
            max(repeat // 5, 3),
        )
        connection.close()

    middle = projection.get_run(run_id(runs // 2))
    results["page_all_ms"] = _median_ms(
        lambda: projection.list_runs(limit=100, after=middle), repeat
    )
    results["page_all_plan"] = query_plan(
        engine, target, lambda: projection.list_runs(limit=100, after=middle)
    )
    pivot = listed[len(listed) // 2] if listed else middle
    results["page_active_ms"] = _median_ms(
        lambda: projection.list_runs(active_filter, limit=20, after=pivot), repeat
    )
    results["count_active_ms"] = _median_ms(lambda: projection.count_runs(active_filter), repeat)
    results["has_active_ms"] = _median_ms(lambda: projection.has_active_workflow(hot), repeat)
    results["count_sweepable"] = projection.count_sweepable(shape.cutoff)
    results["count_sweepable_ms"] = _median_ms(
        lambda: projection.count_sweepable(shape.cutoff), max(repeat // 5, 3)
    )
    results["count_sweepable_plan"] = query_plan(
        engine, target, lambda: projection.count_sweepable(shape.cutoff)
    )
    raw.close()
    engine.dispose()
    return results


# 3. (the retention sweep) is in sweep.py.


# ---------------------------------------------------------- 5. iter_runs ---


def iterate(target: Target, runs: int) -> dict[str, Any]:
    engine = create_engine(target.url)
    projection = RunProjection(engine)
    iterator = projection.iter_runs()
    first = next(iterator)  # the first page is in: engine, caches and one page resident
    baseline = proc_status_kib("VmRSS")
    count = 1
    previous = first
    started = time.perf_counter()
    for run in iterator:
        if (run.started_at, run.id) <= (previous.started_at, previous.id):
            raise AssertionError("iter_runs out of order")
        previous = run
        count += 1
    elapsed = time.perf_counter() - started
    engine.dispose()
    if count != runs:
        raise AssertionError(f"iter_runs yielded {count} runs, expected {runs}")
    return {
        "runs": count,
        "seconds": elapsed,
        "baseline_rss_kib": baseline,
        "peak_rss_kib": proc_status_kib("VmHWM"),
        "pid": os.getpid(),
    }
