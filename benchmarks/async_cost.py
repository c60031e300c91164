"""Where the async layer's cost over bare Core goes on PostgreSQL (issue 21).

``get_run`` awaited in a loop, CPU time per call (``time.process_time``), on a
throwaway database at head, each step adding one thing the layer does to the
step before, taking turns round after round:

* ``bare Core``: benchmarks/bare_core.py's held reader ``AsyncConnection``,
  one ``run_sync`` per call (no listeners);
* ``+ checkout per call``: the same body in one greenlet
  (``AsyncSession.run_sync``, as execution.py's ``_in_greenlet``) that checks a
  connection out of a pool and returns it -- the pool's checkout, its reset on
  return and the ``Connection`` object each call -- on an engine made with
  ``isolation_level="AUTOCOMMIT"``, so that no call sends BEGIN;
* ``+ AUTOCOMMIT per call``: the same on an engine in the default mode, each
  connection switched into AUTOCOMMIT (dialect.read_options) after its checkout
  and back on its return, as the layer must (its engine also serves the
  application's transactions) -- one driver call each way;
* ``+ shield task``: that call in a task of its own awaited through
  ``asyncio.shield``, as ``AsyncExecutor.run`` does for cancellation safety;
* ``layer``: ``AsyncRunProjection.get_run`` itself (its engine's connect and
  ``engine_disposed`` listeners, validation, error translation, retries);
* and beside them ``bare Core + shield task``: the held connection's call in a
  shielded task of its own -- the least a layer that kept its connection
  between calls would still pay to stay cancellation-safe.

    .venv/bin/python -m benchmarks.async_cost [--driver psycopg|asyncpg] [--calls 2000]

Reports; never gates.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.ext.asyncio import create_async_engine as sqlalchemy_async_engine

from relay_flow_projection import (
    AsyncRunProjection,
    RunProjection,
    RunStart,
    create_async_engine,
    create_engine,
    upgrade,
)
from relay_flow_projection.models import Run

from . import bare_core
from .bare_core import BareCoreAsync
from .dataset import PostgresDatabases
from .raw_async import async_url

RUN = "r1"


def _get_run_on_checkout(engine: AsyncEngine, switch: bool) -> Callable[[Any], Run]:
    """The sync body of one call: check out, (*switch* to AUTOCOMMIT,) read, check in."""
    sync_engine = engine.sync_engine

    def body(_session: Any) -> Run:
        conn: Connection = sync_engine.connect()
        with conn:
            if switch:
                conn.execution_options(isolation_level="AUTOCOMMIT")
            return bare_core.get_run(conn, RUN)

    return body


async def _per_call_us(call: Callable[[], Awaitable[object]], calls: int) -> float:
    started = time.process_time_ns()
    for _ in range(calls):
        await call()
    return (time.process_time_ns() - started) / calls / 1000


async def _measure(url: str, calls: int, rounds: int) -> dict[str, list[float]]:
    bare = await BareCoreAsync.open(url)
    layer = AsyncRunProjection(create_async_engine(url))
    greenlets = AsyncSession()  # only its run_sync, as execution.py uses it
    settings = bare_core.driver_settings(url, asynchronous=True)
    autocommit_engine = sqlalchemy_async_engine(
        settings[0], isolation_level="AUTOCOMMIT", **settings[1]
    )
    checkout = _get_run_on_checkout(autocommit_engine, switch=False)
    switched = _get_run_on_checkout(bare.engine, switch=True)

    def shielded(call: Callable[[], Awaitable[Run]]) -> Callable[[], Awaitable[Run]]:
        async def in_task() -> Run:
            return await asyncio.shield(asyncio.ensure_future(call()))

        return in_task

    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "bare Core": lambda: bare.get_run(RUN),
        "+ checkout per call": lambda: greenlets.run_sync(checkout),
        "+ AUTOCOMMIT per call": lambda: greenlets.run_sync(switched),
        "+ shield task": shielded(lambda: greenlets.run_sync(switched)),
        "layer": lambda: layer.get_run(RUN),
        "bare Core + shield task": shielded(lambda: bare.get_run(RUN)),
    }
    try:
        expected = await layer.get_run(RUN)
        for name, call in cases.items():  # warm-up, and the same row from every case
            if await call() != expected:
                raise AssertionError(f"{name} read a different run")
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):
            for name, call in cases.items():
                results[name].append(await _per_call_us(call, calls))
        return results
    finally:
        await bare.close()
        await autocommit_engine.dispose()
        await layer.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", choices=("psycopg", "asyncpg"), default="psycopg")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    databases = PostgresDatabases()
    try:
        url = databases.url(databases.create("async_cost"))
        upgrade(url)
        seeding = create_engine(url)
        RunProjection(seeding).insert_start(
            RunStart(RUN, "repo", "wf", "t", "k"), datetime.now(UTC)
        )
        seeding.dispose()
        results = asyncio.run(_measure(async_url(url, args.driver), args.calls, args.rounds))
    finally:
        databases.drop_all()
    floor = statistics.median(results["bare Core"])
    print(
        f"PostgreSQL {args.driver} async get_run, CPU µs per call, "
        f"median of {args.rounds} rounds of {args.calls}:"
    )
    previous = floor
    for name, values in results.items():
        median = statistics.median(values)
        step = median - (floor if name == "bare Core + shield task" else previous)
        print(f"  {name:<24} {median:6.1f} µs  ({median / floor:.2f}x bare Core, {step:+6.1f} µs)")
        previous = median


if __name__ == "__main__":
    main()
