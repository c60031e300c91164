"""Round trips per call on PostgreSQL, counted on the wire (turn_counter.py).

Each operation runs through the layer and through bare Core (bare_core.py),
on connections made through a :class:`TurnCounter` proxy: the sync facade on
psycopg, the async facade on psycopg's asyncio mode and on asyncpg. After one
warm-up call (connected, dialect initialized, statements compiled), the
proxy's count over ``CALLS`` calls, divided by ``CALLS``, is the number of
times each call waited for the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import make_url

from relay_flow_projection import (
    AsyncRunProjection,
    NodeSessionRegistration,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
)

from .bare_core import BareCore, BareCoreAsync
from .dataset import Shape, run_id
from .raw_async import async_url
from .sections import Target
from .turn_counter import TurnCounter

CALLS = 20  # per operation and side; the count is the same for each call


def _start(k: int) -> RunStart:
    return RunStart(f"rt-{k:09d}", "repo-1", "workflow-7", f"T-rt{k}", f"KEY-rt{k}")


def _calls(runs: int, active: list[str]) -> dict[str, Callable[[Any, int], Any]]:
    return {
        "insert_start": lambda s, k: s.insert_start(_start(k), datetime.now(UTC)),
        "update_node": lambda s, k: s.update_node(
            active[k % len(active)], RunState.RUNNING, "build", f"rt-{k}"
        ),
        "get_run": lambda s, k: s.get_run(run_id((k * 7_919) % runs)),
        "register_node_session": lambda s, k: s.register_node_session(
            NodeSessionRegistration(run_id((k * 104_729) % runs), "build", f"rt-{k}")
        ),
    }


def round_trips(target: Target, runs: int) -> dict[str, Any]:
    """Round trips per call of each operation: layer and bare Core, sync (psycopg) and
    async (psycopg, asyncpg), each on its own connections through one proxy."""
    url = make_url(target.url)
    assert url.host is not None
    active = [run_id(i) for i in Shape(runs).active_indexes()]
    calls = _calls(runs, active)
    serial = iter(range(10**9))
    results: dict[str, Any] = {}
    with TurnCounter(url.host, url.port or 5432) as proxy:
        proxied = proxy.url(target.url)
        projection = RunProjection(create_engine(proxied))
        bare = BareCore(proxied)
        sides: dict[str, Any] = {"layer": projection, "bare": bare}
        sync: dict[str, dict[str, float]] = {}
        for name, call in calls.items():
            sync[name] = {}
            for side_name, side in sides.items():
                call(side, next(serial))  # warm: connected, dialect initialized, compiled
                before = proxy.count()
                for _ in range(CALLS):
                    call(side, next(serial))
                sync[name][side_name] = (proxy.count() - before) / CALLS
        bare.close()
        projection.engine.dispose()
        results["psycopg"] = sync
        for driver in ("psycopg", "asyncpg"):
            results[f"{driver}_async"] = asyncio.run(
                _async_round_trips(proxy, async_url(proxied, driver), calls, serial)
            )
    return results


async def _async_round_trips(
    proxy: TurnCounter, url: str, calls: dict[str, Callable[[Any, int], Any]], serial: Any
) -> dict[str, dict[str, float]]:
    engine = create_async_engine(url)
    sides: dict[str, Any] = {
        "layer": AsyncRunProjection(engine),
        "bare": await BareCoreAsync.open(url),
    }
    measured: dict[str, dict[str, float]] = {}
    try:
        for name, call in calls.items():
            measured[name] = {}
            for side_name, side in sides.items():
                await call(side, next(serial))
                before = proxy.count()
                for _ in range(CALLS):
                    await call(side, next(serial))
                measured[name][side_name] = (proxy.count() - before) / CALLS
    finally:
        await sides["bare"].close()
        await engine.dispose()
    return measured
