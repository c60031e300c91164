"""A real PostgreSQL restart and outage, on a throwaway cluster (tests/pg_cluster.py).

What production sees when its server restarts or fails over: every pooled
connection is dead at once. The contract (API.md, "Production behaviour"):
after the server is back, no call fails because of connections broken by
that outage (the pool is invalidated once, and a call that lost its
connection before it did anything is retried once); while the server is
down, calls fail fast with the retryable ``DatabaseUnavailable``.

Runs on the sync facade and on both async drivers.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from pg_cluster import PgCluster, postgres_bindir
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    AsyncRunProjection,
    DatabaseUnavailable,
    NodeSessionRegistration,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
    upgrade,
)

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
POOL_SIZE = 5


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    bindir = postgres_bindir()
    if bindir is None:
        reason = "initdb/pg_ctl not found (pg_config --bindir)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {reason}", pytrace=False)
        pytest.skip(reason)
    server = PgCluster(bindir)
    server.init()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def database(cluster: PgCluster, request: pytest.FixtureRequest) -> str:
    """A fresh database on the cluster, at head; its psycopg URL."""
    name = f"r_{abs(hash(request.node.nodeid)) % 10**12}"
    admin = sa.create_engine(cluster.url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    url = cluster.url().rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    return url


# One call of every kind of operation, on run "r<i>" (created by the first).
CALLS: list[tuple[str, Callable[[Any, int], Any]]] = [
    ("insert_start", lambda p, i: p.insert_start(RunStart(f"r{i}", "r", "wf", "T", f"K{i}"), NOW)),
    ("update_node", lambda p, i: p.update_node(f"r{i}", RunState.RUNNING, "build", "v1")),
    ("get_run", lambda p, i: p.get_run(f"r{i}")),
    ("list_runs", lambda p, i: p.list_runs()),
    ("register_node_session", lambda p, i: p.register_node_session(
        NodeSessionRegistration(f"r{i}", "build", "s1"))),
    ("record_processed_report", lambda p, i: p.record_processed_report(f"r{i}", "v1", "rep")),
    ("has_processed_report", lambda p, i: p.has_processed_report(f"r{i}", "rep")),
    ("count_runs", lambda p, i: p.count_runs()),
]  # fmt: skip


def _sync_calls(projection: RunProjection, round_: int) -> list[str]:
    failed = []
    for name, call in CALLS:
        try:
            call(projection, round_)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def _warm_sync_pool(projection: RunProjection) -> None:
    """Every pooled connection open, as in a busy service before the restart."""
    connections = [projection.engine.connect() for _ in range(POOL_SIZE)]
    for connection in connections:
        connection.close()
    assert projection.engine.pool.checkedin() == POOL_SIZE  # type: ignore[attr-defined]


def test_restart_costs_no_failed_call_sync(cluster: PgCluster, database: str) -> None:
    projection = RunProjection(create_engine(database, pool_size=POOL_SIZE))
    try:
        assert _sync_calls(projection, 0) == []
        for round_ in (1, 2):
            _warm_sync_pool(projection)
            cluster.restart()
            assert _sync_calls(projection, round_) == []
        assert projection.get_run("r2").current_node == "build"
    finally:
        projection.close()
        projection.engine.dispose()


def test_outage_fails_fast_with_the_retryable_error_sync(cluster: PgCluster, database: str) -> None:
    projection = RunProjection(create_engine(database, pool_size=POOL_SIZE, connect_timeout=3))
    try:
        projection.insert_start(RunStart("r0", "repo", "wf", "T", "K0"), NOW)
        _warm_sync_pool(projection)
        cluster.stop()
        try:
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as raised:
                projection.get_run("r0")
            assert time.monotonic() - started < 10
            assert "r0" in str(raised.value)
            with pytest.raises(DatabaseUnavailable):
                projection.update_node("r0", RunState.RUNNING, "build", "v1")
        finally:
            cluster.start()
        # Back: the write that failed was not half-done, and retrying it works.
        assert projection.get_run("r0").current_node is None
        projection.update_node("r0", RunState.RUNNING, "build", "v1")
        assert projection.get_run("r0").current_node == "build"
    finally:
        projection.engine.dispose()


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coroutine)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_restart_costs_no_failed_call_async(cluster: PgCluster, database: str, driver: str) -> None:
    url = database.replace("postgresql+psycopg://", f"postgresql+{driver}://")

    async def calls(projection: AsyncRunProjection, round_: int) -> list[str]:
        failed = []
        for name, call in CALLS:
            try:
                await call(projection, round_)
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
        return failed

    async def scenario() -> None:
        engine = create_async_engine(url, pool_size=POOL_SIZE)
        projection = AsyncRunProjection(engine)
        try:
            assert await calls(projection, 0) == []
            for round_ in (1, 2):
                connections = [await engine.connect() for _ in range(POOL_SIZE)]
                for connection in connections:
                    await connection.close()
                # The restart blocks this loop on purpose: the service is idle meanwhile.
                cluster.restart()
                assert await calls(projection, round_) == []
            assert (await projection.get_run("r2")).current_node == "build"
        finally:
            await engine.dispose()

    _run(scenario())


def test_restart_under_load_loses_no_acknowledged_write(cluster: PgCluster, database: str) -> None:
    """Writers keep going through a stop and start of the server.

    Every failure during the outage is DatabaseUnavailable; every call started
    after the server is back succeeds; every acknowledged write is there.
    """
    projection = RunProjection(create_engine(database, pool_size=POOL_SIZE, connect_timeout=2))
    stop = threading.Event()
    acknowledged: list[str] = []
    failures: list[tuple[float, BaseException]] = []
    calls = [0]
    guard = threading.Lock()

    def writer(name: str) -> None:
        step = 0
        while not stop.is_set():
            run_id = f"{name}-{step}"
            started = time.monotonic()
            try:
                projection.insert_start(RunStart(run_id, "r", "wf", "T", run_id), NOW)
                projection.update_node(run_id, RunState.RUNNING, "build", "v1")
            except Exception as exc:
                with guard:
                    failures.append((started, exc))
                time.sleep(0.05)  # a caller backing off before it retries
            else:
                with guard:
                    acknowledged.append(run_id)
            with guard:
                calls[0] += 2
            step += 1

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        cluster.stop()
        time.sleep(1.0)
        cluster.start()
        back = time.monotonic()
        time.sleep(1.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        projection.engine.dispose()

    after_recovery = [exc for started, exc in failures if started >= back]
    wrong_kind = [exc for _, exc in failures if not isinstance(exc, DatabaseUnavailable)]
    stored = RunProjection(create_engine(database))
    try:
        present = {run.id for run in stored.iter_runs() if run.current_node == "build"}
    finally:
        stored.engine.dispose()
    lost = sorted(set(acknowledged) - present)
    print(
        f"\nrestart under load: {calls[0]} calls, {len(failures)} failed during the outage "
        f"(all DatabaseUnavailable: {not wrong_kind}), {len(after_recovery)} failed after "
        f"recovery, {len(acknowledged)} acknowledged run writes, {len(lost)} lost"
    )
    assert failures, "the outage was not observed: the test did not test anything"
    assert wrong_kind == []
    assert after_recovery == []
    assert lost == []
