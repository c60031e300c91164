"""PostgreSQL by nature: concurrent deployers, identity races, types, offline DDL."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import async_target

from relay_flow_projection import (
    AsyncRunProjection,
    ExecutorIdentity,
    IdentityMismatch,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
    init_database_with_identity,
    open_projection,
    upgrade,
)
from relay_flow_projection.migrate import head_revision

REPO_ROOT = Path(__file__).resolve().parent.parent
ALEMBIC = str(Path(sys.executable).with_name("alembic"))


def _alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RELAY_FLOW_DATABASE_URL": url}
    return subprocess.run(
        [ALEMBIC, "-c", str(REPO_ROOT / "alembic.ini"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_timestamps_are_timestamptz(postgres_url: str) -> None:
    upgrade(postgres_url)
    engine = create_engine(postgres_url)
    try:
        columns = {c["name"]: c["type"] for c in sa.inspect(engine).get_columns("relay_runs")}
        for name in ("started_at", "updated_at", "finished_at", "next_retry_at"):
            column_type = columns[name]
            assert isinstance(column_type, sa.TIMESTAMP)
            assert column_type.timezone, name
        # A value given at +05:30 is one instant, read back in UTC.
        projection = RunProjection(engine)
        india = timezone(timedelta(hours=5, minutes=30))
        started = datetime(2026, 3, 1, 9, 30, 0, 250000, tzinfo=india)
        projection.insert_start(RunStart("r", "repo", "wf", "T", "K"), started)
        run = projection.get_run("r")
        assert run.started_at == started
        assert run.started_at.tzinfo is UTC
        assert run.started_at.hour == 4
    finally:
        engine.dispose()


def test_concurrent_alembic_upgrades_run_the_chain_once(postgres_url: str) -> None:
    """Deployers at once: all succeed; the advisory lock lets the chain run once."""
    env = {**os.environ, "RELAY_FLOW_DATABASE_URL": postgres_url}
    command = [ALEMBIC, "-c", str(REPO_ROOT / "alembic.ini"), "upgrade", "head"]
    processes = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0] * 4, outputs
    logs = "".join(out + err for out, err in outputs)
    revisions = [line for line in logs.splitlines() if "Running upgrade" in line]
    assert len(revisions) == 5, logs  # each of 0001..0005 exactly once, across all
    current = _alembic(postgres_url, "current")
    assert head_revision() in current.stdout


def _initialize(url: str, namespace: str, barrier: multiprocessing.synchronize.Barrier) -> str:
    barrier.wait(timeout=60)
    identity = ExecutorIdentity("temporal", "temporal.internal:7233", namespace)
    try:
        init_database_with_identity(url, identity)
    except IdentityMismatch:
        return "mismatch"
    return "written"


def _race(url: str, callers: int) -> list[str]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Manager().Barrier(callers)
    with context.Pool(callers) as pool:
        pending = [
            pool.apply_async(_initialize, (url, f"namespace-{index}", barrier))
            for index in range(callers)
        ]
        return [result.get(timeout=180) for result in pending]


def test_identity_race_writes_exactly_one_marker(postgres_url: str) -> None:
    """Several processes initialize one fresh database with different identities at once."""
    outcomes = _race(postgres_url, 6)
    assert sorted(outcomes) == ["mismatch"] * 5 + ["written"], outcomes
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT count(*) FROM relay_executor_identity"))
            assert rows.scalar_one() == 1
        marker = RunProjection(engine).identity()
        assert marker is not None
        assert marker.executor_plugin == "temporal"
    finally:
        engine.dispose()


def test_offline_sql_prints_postgresql_ddl(postgres_url: str) -> None:
    """`alembic upgrade head --sql` prints DDL for DBAs and touches no database."""
    result = _alembic(postgres_url, "upgrade", "head", "--sql")
    assert result.returncode == 0, result.stderr
    assert "CREATE TABLE relay_runs" in result.stdout
    assert "TIMESTAMP WITH TIME ZONE" in result.stdout
    assert "WHERE state NOT IN ('canceled', 'completed')" in result.stdout
    engine = sa.create_engine(postgres_url)
    try:
        assert "alembic_version" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


# ------------------------------------------- prepared statements: defaults and opt-in ---

PREPARED_ON_THIS_CONNECTION = "SELECT count(*) FROM pg_prepared_statements"
# psycopg's own default (prepare after 5 executions); asyncpg's caches on.
OPT_IN: dict[str, dict[str, object]] = {
    "psycopg": {"prepare_threshold": 5},
    "psycopg-async": {"prepare_threshold": 5},
    "asyncpg": {"statement_cache_size": 100, "prepared_statement_cache_size": 100},
}


def _prepared_after_calls(postgres_url: str, driver: str, connect_args: dict[str, object]) -> int:
    """Run get_run/update_node 12 times on a pool of one connection; then count the
    named prepared statements that connection holds on the server."""
    upgrade(postgres_url)
    if driver == "psycopg":
        engine = create_engine(postgres_url, pool_size=1, connect_args=connect_args)
        try:
            projection = RunProjection(engine)
            projection.insert_start(RunStart("r1", "repo", "wf", "t", "k1"), NOW)
            for visit in range(12):
                projection.update_node("r1", RunState.RUNNING, "n", f"v{visit}")
                assert projection.get_run("r1").current_node_visit_id == f"v{visit}"
            with engine.connect() as connection:
                return int(connection.exec_driver_sql(PREPARED_ON_THIS_CONNECTION).scalar_one())
        finally:
            engine.dispose()

    target, kwargs = async_target(postgres_url, "asyncpg" if driver == "asyncpg" else "async")
    kwargs["connect_args"] = {**kwargs.get("connect_args", {}), **connect_args}

    async def calls() -> int:
        engine = create_async_engine(target, pool_size=1, **kwargs)
        try:
            projection = AsyncRunProjection(engine)
            await projection.insert_start(RunStart("r1", "repo", "wf", "t", "k1"), NOW)
            for visit in range(12):
                await projection.update_node("r1", RunState.RUNNING, "n", f"v{visit}")
                run = await projection.get_run("r1")
                assert run.current_node_visit_id == f"v{visit}"
            async with engine.connect() as connection:
                result = await connection.exec_driver_sql(PREPARED_ON_THIS_CONNECTION)
                return int(result.scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(calls())


NOW = datetime(2026, 12, 5, tzinfo=UTC)


@pytest.mark.parametrize("driver", sorted(OPT_IN))
def test_by_default_nothing_is_prepared_on_the_server(postgres_url: str, driver: str) -> None:
    """The pooler-safe default: no named statement a pooler could hand to another client."""
    assert _prepared_after_calls(postgres_url, driver, {}) == 0


@pytest.mark.parametrize("driver", sorted(OPT_IN))
def test_a_direct_connection_may_opt_in_to_prepared_statements(
    postgres_url: str, driver: str
) -> None:
    """connect_args win over the defaults (README "Behind PgBouncer"), and the calls work."""
    assert _prepared_after_calls(postgres_url, driver, OPT_IN[driver]) > 0


def test_postgres_scheme_means_postgresql_with_psycopg(postgres_url: str) -> None:
    """API.md accepts libpq's and Heroku's ``postgres://`` as ``postgresql://``."""
    target = postgres_url.replace("postgresql+psycopg://", "postgres://", 1)
    upgrade(target)
    with open_projection(target) as projection:
        assert projection.engine.url.drivername == "postgresql+psycopg"
        assert projection.list_runs() == []
