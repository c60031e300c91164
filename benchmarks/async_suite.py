"""Sections 6 (asyncio) and 7 (pooler-safe defaults) of the benchmark driver.

``suite.measure_dialect`` calls :func:`measure_async` once per dialect; like
every other section, each measurement runs in a child process
(``async_sections.py``) on a fresh copy of the data set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .suite import Databases, Sizes
    from .table import Results


@dataclass(frozen=True, slots=True)
class AsyncSizes:
    tasks: int  # concurrent tasks on PostgreSQL
    pool_size: int  # connections: the layer's pool, the raw pool, the sync engine's pool
    threads: int  # the sync facade's threads
    rounds: int  # rounds of each contender, in rotating order
    seconds: float  # length of one round


ASYNC_FULL = AsyncSizes(tasks=64, pool_size=8, threads=8, rounds=5, seconds=2.0)
ASYNC_QUICK = AsyncSizes(tasks=64, pool_size=8, threads=8, rounds=2, seconds=0.5)

# Which async drivers run on which database.
ASYNC_DRIVERS = {"sqlite": ("aiosqlite",), "postgresql": ("psycopg", "asyncpg")}


def measure_async(databases: Databases, sizes: Sizes, results: Results) -> None:
    from .suite import log, run_child  # suite imports this module

    dialect = databases.dialect
    concurrency = ASYNC_QUICK if results.quick else ASYNC_FULL
    results.sizes["async"] = asdict(concurrency)
    blocks = {
        "runs": sizes.runs,
        "rounds": sizes.rounds,
        "block": sizes.read_block,
        "write_block": sizes.write_block[dialect],
        "write_rounds": sizes.write_rounds[dialect],
    }
    for driver in ASYNC_DRIVERS[dialect]:
        with databases.fresh() as target:
            log(f"{dialect}: 6. AsyncRunProjection on {driver} vs the raw async driver")
            measured = run_child("async_operations", target, driver=driver, **blocks)
            results.put(dialect, f"async_operations_{driver}", measured)
    if dialect != "postgresql":
        return
    with databases.fresh() as target:
        log(
            f"{dialect}: 6. {concurrency.tasks} tasks on {concurrency.pool_size} connections "
            f"(async layer, raw async drivers, sync facade with {concurrency.threads} threads)"
        )
        measured = run_child("async_concurrency", target, runs=sizes.runs, **asdict(concurrency))
        results.put(dialect, "async_concurrency", measured)
    with databases.fresh() as target:
        log(f"{dialect}: 7. pooler-safe defaults against the drivers' own, direct connection")
        results.put(dialect, "pooler_cost", run_child("pooler_cost", target, **blocks))
