"""The asyncio sections (6) and the cost of the pooler-safe defaults (7).

Like ``sections.py``, each function runs in a child process of its own on a
fresh database and returns a JSON-able dict:

- ``async_operations``: the single-row methods through ``AsyncRunProjection``
  against the raw async driver (``raw_async.py``) sending the same SQL with the
  same transactions (checked at the driver first), in alternating blocks;
- ``async_concurrency``: 64 tasks doing ``get_run`` / ``update_node`` on
  PostgreSQL through the async layer, through the raw async drivers with
  the same number of connections and through bare Core on as many held
  ``AsyncConnection`` pairs (the floor of SQLAlchemy's asyncio itself), the
  sync facade with 8 threads beside them, the same 64 tasks awaiting the
  sync facade on 8 worker threads (the alternative to an async layer issue
  21 asks to measure), and the longest
  stall of a 1 ms heartbeat task during each run from the loop;
- ``pooler_cost``: the same single-row methods on a direct PostgreSQL
  connection with the layer's pooler-safe defaults against the drivers'
  own defaults (psycopg ``prepare_threshold=5``, asyncpg's statement caches).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import itertools
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from relay_flow_projection import (
    AsyncRunProjection,
    NodeSessionRegistration,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
)
from relay_flow_projection.models import Run

from .bare_core import BareCoreAsync
from .dataset import Shape, run_id
from .raw_async import (
    RawAsyncDriver,
    RawPool,
    RawPoolWork,
    async_url,
    open_raw,
    verify_same_sql_async,
)
from .sections import Target, _alternate, summarize

OPERATIONS = ("insert_start", "update_node", "get_run", "register_node_session")
HEARTBEAT_S = 0.001
# What the drivers do by default, opted back into on a direct connection.
PSYCOPG_DEFAULT = {"prepare_threshold": 5}
ASYNCPG_DEFAULT = {"statement_cache_size": 100, "prepared_statement_cache_size": 100}


def _us(nanoseconds: float) -> float:
    return nanoseconds / 1000.0


async def _alternate_async(
    rounds: int,
    block: int,
    layer: Callable[[int], Awaitable[object]],
    raw: Callable[[int], Awaitable[object]],
) -> dict[str, float]:
    """``sections._alternate`` for coroutines: median µs/op of alternating blocks."""
    measured = await alternate_many_async(rounds, block, {"layer": layer, "raw": raw})
    return {key: measured[key] for key in ("layer_us", "raw_us", "ratio")}


async def alternate_many_async(
    rounds: int, block: int, contenders: dict[str, Callable[[int], Awaitable[object]]]
) -> dict[str, Any]:
    """``sections.alternate_many`` for coroutines: blocks that take turns, medians, ranges."""
    counter = itertools.count()
    for op in contenders.values():  # warm caches, compiled statements, pools
        for _ in range(max(block // 5, 5)):
            await op(next(counter))
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            op = contenders[name]
            started = time.perf_counter_ns()
            for _ in range(block):
                await op(next(counter))
            times[name].append(_us((time.perf_counter_ns() - started) / block))
    return summarize(times)


def _start(k: int) -> RunStart:
    return RunStart(f"new-{k:09d}", "repo-1", "workflow-7", f"T-n{k}", f"KEY-n{k}")


def _registration(runs: int, k: int) -> NodeSessionRegistration:
    return NodeSessionRegistration(run_id((k * 104_729) % runs), "build", f"s-{k}")


# ------------------------------------------------ 6. single-row, async ---


def async_operations(
    target: Target,
    driver: str,
    runs: int,
    rounds: int,
    block: int,
    write_block: int,
    write_rounds: int,
) -> dict[str, Any]:
    return asyncio.run(
        _async_operations(target, driver, runs, rounds, block, write_block, write_rounds)
    )


async def _async_operations(
    target: Target,
    driver: str,
    runs: int,
    rounds: int,
    block: int,
    write_block: int,
    write_rounds: int,
) -> dict[str, Any]:
    shape = Shape(runs)
    active = [run_id(i) for i in shape.active_indexes()]
    now = datetime.now(UTC)
    one = _registration(runs, -1)
    checks: list[
        tuple[
            Callable[[AsyncRunProjection], Awaitable[object]],
            Callable[[RawAsyncDriver], Awaitable[object]],
        ]
    ] = [
        (lambda p: p.insert_start(_start(-1), now), lambda r: r.insert_start(_start(-1), now)),
        (
            lambda p: p.update_node(active[0], RunState.RUNNING, "build", "v"),
            lambda r: r.update_node(active[0], RunState.RUNNING, "build", "v"),
        ),
        (lambda p: p.get_run(active[0]), lambda r: r.get_run(active[0])),
        (lambda p: p.register_node_session(one), lambda r: r.register_node_session(one)),
    ]
    statements = 0
    for layer_call, raw_call in checks:
        statements += len(
            await verify_same_sql_async(driver, target.url, target.conninfo, layer_call, raw_call)
        )

    engine = create_async_engine(async_url(target.url, driver))
    projection = AsyncRunProjection(engine)
    raw = await open_raw(driver, target.url, target.conninfo)
    bare = await BareCoreAsync.open(async_url(target.url, driver))
    try:
        expected = await projection.get_run(active[0])
        if await raw.get_run(active[0]) != expected or await bare.get_run(active[0]) != expected:
            raise AssertionError("the raw or bare-Core mapping differs from the layer's")
        results: dict[str, Any] = {"driver": driver, "statements_checked": statements}
        sides: dict[str, Any] = {"layer": projection, "bare": bare, "raw": raw}

        def each(
            call: Callable[[Any, int], Awaitable[object]],
        ) -> dict[str, Callable[[int], Awaitable[object]]]:
            return {name: functools.partial(call, side) for name, side in sides.items()}

        results["insert_start"] = await alternate_many_async(
            write_rounds,
            write_block,
            each(lambda s, k: s.insert_start(_start(k), datetime.now(UTC))),
        )
        results["update_node"] = await alternate_many_async(
            write_rounds,
            write_block,
            each(
                lambda s, k: s.update_node(
                    active[k % len(active)], RunState.RUNNING, "build", f"v-{k}"
                )
            ),
        )
        results["get_run"] = await alternate_many_async(
            rounds, block, each(lambda s, k: s.get_run(run_id((k * 7_919) % runs)))
        )
        results["register_node_session"] = await alternate_many_async(
            write_rounds,
            write_block,
            each(lambda s, k: s.register_node_session(_registration(runs, k))),
        )
    finally:
        await bare.close()
        await raw.close()
        await engine.dispose()
    return results


# ------------------------------------------- 6. 64 tasks on PostgreSQL ---


class Work(Protocol):
    """What each task calls: AsyncRunProjection or a raw pool."""

    async def get_run(self, run_id: str) -> Run: ...
    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None: ...


async def _heartbeat(stop: asyncio.Event, stalls: list[float]) -> None:
    """Sleep 1 ms again and again; record how much later than asked each wake-up came."""
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(HEARTBEAT_S)
        stalls.append(time.perf_counter() - before - HEARTBEAT_S)


@dataclass(frozen=True, slots=True)
class TaskRun:
    calls_per_s: float
    cpu_us: float  # the process's CPU time per call
    max_stall_ms: float  # the heartbeat's longest delay beyond 1 ms
    p99_stall_ms: float


async def _drive_tasks(work: Work, assigned: list[str], seconds: float, label: str) -> TaskRun:
    """len(*assigned*) tasks, each looping get_run + update_node on its own run for
    *seconds*, beside a 1 ms heartbeat task."""
    stop = asyncio.Event()
    calls = [0]
    stalls: list[float] = []

    async def worker(number: int, rid: str) -> None:
        for k in itertools.count():
            if stop.is_set():
                return
            await work.get_run(rid)
            await work.update_node(rid, RunState.RUNNING, "build", f"{label}-{number}-{k}")
            calls[0] += 2

    heartbeat = asyncio.create_task(_heartbeat(stop, stalls))
    started = time.perf_counter()
    cpu = time.process_time()
    workers = [asyncio.create_task(worker(n, rid)) for n, rid in enumerate(assigned)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*workers)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    await heartbeat
    stalls.sort()
    return TaskRun(
        calls_per_s=calls[0] / elapsed,
        cpu_us=_us(cpu * 1e9 / max(calls[0], 1)),
        max_stall_ms=stalls[-1] * 1000 if stalls else 0.0,
        p99_stall_ms=stalls[int(len(stalls) * 0.99)] * 1000 if stalls else 0.0,
    )


class BarePoolWork:
    """The bare-Core floor for many tasks: *size* :class:`BareCoreAsync` slots (a held
    reader and writer ``AsyncConnection`` each, no listeners) shared through a
    :class:`RawPool` queue, as the raw drivers' connections are. Twice the raw side's
    server connections (the reader stays in AUTOCOMMIT); what it measures is the client's
    CPU for SQLAlchemy's asyncio execution itself, the least any layer on it pays."""

    def __init__(self, pool: RawPool) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, url: str, size: int) -> BarePoolWork:
        return cls(RawPool([await BareCoreAsync.open(url) for _ in range(size)]))

    async def get_run(self, run_id: str) -> Run:
        async with self.pool.connection() as bare:
            run: Run = await bare.get_run(run_id)
            return run

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        async with self.pool.connection() as bare:
            await bare.update_node(run_id, state, node, visit_id)

    async def close(self) -> None:
        await self.pool.close()


class SyncOnThreads:
    """The sync facade's calls run on *threads* worker threads, awaited from tasks
    (``loop.run_in_executor``): the alternative to the async executor."""

    def __init__(self, projection: RunProjection, threads: int) -> None:
        self._projection = projection
        self._threads = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="relay-bench-sync"
        )

    async def get_run(self, run_id: str) -> Run:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._projection.get_run, run_id)

    async def update_node(self, run_id: str, state: RunState, node: str, visit_id: str) -> None:
        loop = asyncio.get_running_loop()
        call = functools.partial(self._projection.update_node, run_id, state, node, visit_id)
        await loop.run_in_executor(self._threads, call)

    def close(self) -> None:
        self._threads.shutdown()


def _drive_threads(
    projection: RunProjection, assigned: list[str], threads: int, seconds: float
) -> tuple[float, float]:
    """*threads* threads looping get_run + update_node (each on its share of the runs);
    returns (calls per second, CPU µs per call)."""
    stop = threading.Event()
    counts = [0] * threads
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def worker(number: int) -> None:
        mine = assigned[number::threads]
        barrier.wait()
        try:
            for k in itertools.count():
                if stop.is_set():
                    return
                rid = mine[k % len(mine)]
                projection.get_run(rid)
                projection.update_node(rid, RunState.RUNNING, "build", f"sync-{number}-{k}")
                counts[number] += 2
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    cpu = time.process_time()
    time.sleep(seconds)
    stop.set()
    for thread in pool:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if errors:
        raise errors[0]
    return sum(counts) / elapsed, _us(cpu * 1e9 / max(sum(counts), 1))


def async_concurrency(
    target: Target,
    runs: int,
    tasks: int,
    pool_size: int,
    threads: int,
    rounds: int,
    seconds: float,
) -> dict[str, Any]:
    return asyncio.run(_async_concurrency(target, runs, tasks, pool_size, threads, rounds, seconds))


async def _async_concurrency(
    target: Target,
    runs: int,
    tasks: int,
    pool_size: int,
    threads: int,
    rounds: int,
    seconds: float,
) -> dict[str, Any]:
    shape = Shape(runs)
    active = [run_id(i) for i in shape.active_indexes()]
    assigned = [active[n % len(active)] for n in range(tasks)]  # one run per task
    pool = {"pool_size": pool_size, "max_overflow": 0}
    engines = {
        driver: create_async_engine(async_url(target.url, driver), **pool)
        for driver in ("psycopg", "asyncpg")
    }
    contenders: dict[str, Work] = {
        f"layer_{driver}": AsyncRunProjection(engine) for driver, engine in engines.items()
    }
    raws = {
        driver: await RawPoolWork.open(driver, target.url, target.conninfo, pool_size)
        for driver in ("psycopg", "asyncpg")
    }
    contenders.update({f"raw_{driver}": work for driver, work in raws.items()})
    bares = {
        driver: await BarePoolWork.open(async_url(target.url, driver), pool_size)
        for driver in ("psycopg", "asyncpg")
    }
    contenders.update({f"bare_{driver}": work for driver, work in bares.items()})
    sync_engine = create_engine(target.url, **pool)
    sync = RunProjection(sync_engine)
    on_threads = SyncOnThreads(sync, threads)
    contenders["sync_from_tasks"] = on_threads
    names = [*contenders, "sync_threads"]
    throughput: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    stalls: dict[str, list[float]] = {name: [] for name in contenders}
    p99: dict[str, list[float]] = {name: [] for name in contenders}

    async def one(name: str, duration: float) -> None:
        if name == "sync_threads":
            rate, used = await asyncio.to_thread(_drive_threads, sync, assigned, threads, duration)
        else:
            run = await _drive_tasks(contenders[name], assigned, duration, name)
            rate, used = run.calls_per_s, run.cpu_us
            stalls[name].append(run.max_stall_ms)
            p99[name].append(run.p99_stall_ms)
        throughput[name].append(rate)
        cpu[name].append(used)

    try:
        for name in names:  # warm-up: every connection opened, statements compiled
            await one(name, min(seconds, 0.3))
        for values in (*throughput.values(), *cpu.values(), *stalls.values(), *p99.values()):
            values.clear()
        # What the set-up allocated stays out of the collector's way from now on,
        # and each run starts on a collected heap: a full collection of the
        # garbage one contender left (30 ms here) is not charged to the next one's
        # heartbeat.
        gc.collect()
        gc.freeze()
        for round_number in range(rounds):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                gc.collect()
                await one(name, seconds)
    finally:
        for work in raws.values():
            await work.close()
        for bare in bares.values():
            await bare.close()
        for engine in engines.values():
            await engine.dispose()
        on_threads.close()
        sync.close()
        sync_engine.dispose()
        gc.unfreeze()

    results: dict[str, Any] = {
        "tasks": tasks,
        "pool_size": pool_size,
        "threads": threads,
        "rounds": rounds,
        "seconds": seconds,
        "calls_per_s": {name: statistics.median(v) for name, v in throughput.items()},
        "all_calls_per_s": throughput,
        "cpu_us_per_call": {name: statistics.median(v) for name, v in cpu.items()},
        "max_stall_ms": {name: max(v) for name, v in stalls.items()},
        "p99_stall_ms": {name: max(v) for name, v in p99.items()},
    }
    rates = results["calls_per_s"]
    for driver in ("psycopg", "asyncpg"):
        results[f"{driver}_vs_raw"] = rates[f"layer_{driver}"] / rates[f"raw_{driver}"]
        results[f"{driver}_vs_bare"] = rates[f"layer_{driver}"] / rates[f"bare_{driver}"]
        results[f"{driver}_bare_vs_raw"] = rates[f"bare_{driver}"] / rates[f"raw_{driver}"]
        results[f"{driver}_vs_sync"] = rates[f"layer_{driver}"] / rates["sync_threads"]
        results[f"{driver}_vs_sync_from_tasks"] = (
            rates[f"layer_{driver}"] / rates["sync_from_tasks"]
        )
    return results


# ------------------------------------------- 7. pooler-safe defaults ---


def pooler_cost(
    target: Target, runs: int, rounds: int, block: int, write_block: int, write_rounds: int
) -> dict[str, Any]:
    """Layer with its defaults ("layer") against the driver's own defaults ("raw" slot)."""
    shape = Shape(runs)
    active = [run_id(i) for i in shape.active_indexes()]
    safe = RunProjection(create_engine(target.url))
    prepared = RunProjection(create_engine(target.url, connect_args=dict(PSYCOPG_DEFAULT)))
    psycopg_results: dict[str, Any] = {}
    try:
        for name, calls, count, size in _workloads(
            shape, active, rounds, block, write_block, write_rounds
        ):
            psycopg_results[name] = _renamed(_alternate(count, size, calls(safe), calls(prepared)))
    finally:
        safe.engine.dispose()
        prepared.engine.dispose()
    return {
        "psycopg": psycopg_results,
        "asyncpg": asyncio.run(
            _asyncpg_cost(target, shape, active, rounds, block, write_block, write_rounds)
        ),
    }


def _renamed(measured: dict[str, float]) -> dict[str, float]:
    return {
        "default_us": measured["layer_us"],
        "driver_default_us": measured["raw_us"],
        "ratio": measured["ratio"],
    }


Calls = Callable[[Any], Callable[[int], Any]]


def _workloads(
    shape: Shape, active: list[str], rounds: int, block: int, write_block: int, write_rounds: int
) -> list[tuple[str, Calls, int, int]]:
    """(operation, projection -> call of k, blocks, calls per block) for either facade."""
    runs = shape.runs
    return [
        (
            "insert_start",
            lambda p: lambda k: p.insert_start(_start(k), datetime.now(UTC)),
            write_rounds,
            write_block,
        ),
        (
            "update_node",
            lambda p: (
                lambda k: p.update_node(
                    active[k % len(active)], RunState.RUNNING, "build", f"v-{k}"
                )
            ),
            write_rounds,
            write_block,
        ),
        ("get_run", lambda p: lambda k: p.get_run(run_id((k * 7_919) % runs)), rounds, block),
        (
            "register_node_session",
            lambda p: lambda k: p.register_node_session(_registration(runs, k)),
            write_rounds,
            write_block,
        ),
    ]


async def _asyncpg_cost(
    target: Target,
    shape: Shape,
    active: list[str],
    rounds: int,
    block: int,
    write_block: int,
    write_rounds: int,
) -> dict[str, Any]:
    url = async_url(target.url, "asyncpg")
    safe_engine = create_async_engine(url)
    cached_engine = create_async_engine(url, connect_args=dict(ASYNCPG_DEFAULT))
    safe, cached = AsyncRunProjection(safe_engine), AsyncRunProjection(cached_engine)
    results: dict[str, Any] = {}
    try:
        for name, calls, count, size in _workloads(
            shape, active, rounds, block, write_block, write_rounds
        ):
            results[name] = _renamed(
                await _alternate_async(count, size, calls(safe), calls(cached))
            )
    finally:
        await safe_engine.dispose()
        await cached_engine.dispose()
    return results
