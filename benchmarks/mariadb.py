"""The MariaDB column: the layer against raw PyMySQL on the same SQL, the plans of
the statements that must use an index, and a retention sweep.

"Same SQL": each operation runs once through the layer with a listener that
records the statements and parameters PyMySQL received; the raw side then
executes exactly those statements on one held PyMySQL connection (writes
committed, as the layer's transaction does), with each call's own ids. Rounds
of layer and raw calls alternate, and the medians are reported.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pymysql
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
    create_engine,
    upgrade,
)
from relay_flow_projection.schema import runs as runs_table
from relay_flow_projection.statements import HAS_ACTIVE_WORKFLOW, list_runs

from .bare_core import BareCore
from .sections import alternate_many

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/"
T0 = datetime(2025, 1, 1, tzinfo=UTC)
Captured = list[tuple[str, dict[str, Any]]]


def server_url() -> str:
    return os.environ.get("RELAY_FLOW_BENCH_MYSQL_URL", DEFAULT_URL)


def unavailable() -> str | None:
    try:
        engine = sa.create_engine(server_url(), poolclass=NullPool)
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
        engine.dispose()
    except Exception as exc:  # any failure is the reason to report
        return str(exc).splitlines()[0]
    return None


@contextmanager
def database() -> Iterator[str]:
    """A database of this run's own, dropped afterwards."""
    name = f"relay_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server_url(), poolclass=NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE `{name}` COLLATE utf8mb4_general_ci")
    try:
        yield make_url(server_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def load(url: str, count: int) -> None:
    """*count* runs in 5 workflows; one in ten active, the others finished 30 s after start."""
    engine = sa.create_engine(url, poolclass=NullPool)
    batch: list[dict[str, Any]] = []
    with engine.begin() as connection:
        for index in range(count):
            started = T0 + timedelta(seconds=index)
            active = index % 10 == 0
            batch.append(
                {
                    "id": f"run-{index:08d}",
                    "logical_run_id": f"run-{index:08d}",
                    "attempt_id": 1,
                    "repo": f"repo-{index % 3}",
                    "workflow": f"wf-{index % 5}",
                    "ticket_id": f"T-{index}",
                    "ticket_key": f"KEY-{index}",
                    "state": "running" if active else "completed",
                    "started_at": started,
                    "updated_at": started,
                    "finished_at": None if active else started + timedelta(seconds=30),
                }
            )
            if len(batch) == 5_000:
                connection.execute(runs_table.insert(), batch)
                batch.clear()
        if batch:
            connection.execute(runs_table.insert(), batch)
        connection.exec_driver_sql("ANALYZE TABLE relay_runs")
    engine.dispose()


def capture(engine: sa.Engine, call: Callable[[], object]) -> Captured:
    """The statements (and parameters) *call* sent to PyMySQL, session settings aside."""
    sent: Captured = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        sent.append((statement, dict(parameters or {})))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return sent


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _compare(
    engine: sa.Engine,
    raw: Any,
    layer_call: Callable[[int], object],
    bare_call: Callable[[int], object],
    raw_params: Callable[[int], dict[str, Any]],
    rounds: int,
    block: int,
) -> dict[str, Any]:
    """Blocks of the layer's call, the bare-Core call and the raw statements the layer
    sends, taking turns (sections.alternate_many)."""
    statements = capture(engine, lambda: layer_call(-1))
    writes = not statements[0][0].lstrip().upper().startswith("SELECT")

    def raw_call(i: int) -> None:
        changes = raw_params(i)
        with raw.cursor() as cursor:
            for statement, parameters in statements:
                cursor.execute(statement, {**parameters, **changes})
                cursor.fetchall()
        if writes:
            raw.commit()
        else:
            raw.rollback()  # what the pool's reset-on-return sends after a read

    return alternate_many(rounds, block, {"layer": layer_call, "bare": bare_call, "raw": raw_call})


def measure_operations(url: str, count: int, rounds: int, block: int) -> dict[str, Any]:
    engine = create_engine(url)
    projection = RunProjection(engine)
    parsed = make_url(url)
    raw = pymysql.connect(
        host=parsed.host,
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        database=parsed.database,
        charset="utf8mb4",
        client_flag=pymysql.constants.CLIENT.FOUND_ROWS,
    )
    with raw.cursor() as cursor:  # the layer's session settings (engine.py)
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cursor.execute("SET SESSION time_zone = '+00:00'")
    serial = iter(range(10**9))

    def run_id() -> str:
        return f"run-{next(serial) * 7919 % count:08d}"

    anchor = projection.get_run(f"run-{count // 2:08d}")
    bare = BareCore(url)
    Calls = tuple[Callable[[int], object], Callable[[int], object], Callable[[int], dict[str, Any]]]
    operations: dict[str, Calls] = {
        "get_run": (
            lambda i: projection.get_run(run_id()),
            lambda i: bare.get_run(run_id()),
            lambda i: {"run": run_id()},
        ),
        "insert_start": (
            lambda i: projection.insert_start(
                RunStart(f"new-{i}", "repo-0", "wf-0", "T", f"NEW-{i}"), T0
            ),
            lambda i: bare.insert_start(
                RunStart(f"bare-{i}", "repo-0", "wf-0", "T", f"BARE-{i}"), T0
            ),
            lambda i: {"id": f"raw-{i}", "logical_run_id": f"raw-{i}", "ticket_key": f"RAW-{i}"},
        ),
        "update_node": (
            lambda i: projection.update_node(run_id(), RunState.RUNNING, "build", f"v{i}"),
            lambda i: bare.update_node(run_id(), RunState.RUNNING, "build", f"v{i}"),
            lambda i: {"run": run_id(), "visit": f"v{i}"},
        ),
        "has_active_workflow": (
            lambda i: projection.has_active_workflow("wf-1"),
            lambda i: bare.reader.execute(HAS_ACTIVE_WORKFLOW, {"value": "wf-1"}).scalar_one(),
            lambda i: {},
        ),
        "list_runs page of 100": (
            lambda i: projection.list_runs(limit=100, after=anchor),
            lambda i: list_runs(bare.reader, None, None, None, None, anchor, 100),
            lambda i: {},
        ),
    }
    results = {
        name: _compare(engine, raw, layer_call, bare_call, raw_params, rounds, block)
        for name, (layer_call, bare_call, raw_params) in operations.items()
    }
    bare.close()
    raw.close()
    engine.dispose()
    return results


def plans(url: str, count: int) -> dict[str, str]:
    """EXPLAIN of the statements that must use an index, as PyMySQL sent them."""
    engine = create_engine(url)
    projection = RunProjection(engine)
    anchor = projection.get_run(f"run-{count // 2:08d}")
    cutoff = T0 + timedelta(seconds=count // 5)
    calls: dict[str, Callable[[], object]] = {
        "keyset page (limit 100)": lambda: projection.list_runs(limit=100, after=anchor),
        "active runs of a workflow, page": lambda: projection.list_runs(
            RunFilter(workflow="wf-0", active=True), limit=100, after=anchor
        ),
        "count_runs(workflow=...)": lambda: projection.count_runs(RunFilter(workflow="wf-0")),
        "has_active_workflow": lambda: projection.has_active_workflow("wf-1"),
        # Sweeps nothing (no run finished that early); explained with the real cutoff below.
        "sweep batch selection": lambda: projection.sweep_retention(T0, batch_size=1000),
    }
    shown: dict[str, str] = {}
    parsed = make_url(url)
    for name, call in calls.items():
        statement, parameters = next(
            (s, p) for s, p in capture(engine, call) if "FROM relay_runs" in s
        )
        if "older_than" in parameters:
            parameters = {**parameters, "older_than": cutoff.replace(tzinfo=None)}
        raw = pymysql.connect(
            host=parsed.host,
            port=parsed.port or 3306,
            user=parsed.username,
            password=parsed.password or "",
            database=parsed.database,
        )
        with raw.cursor(pymysql.cursors.DictCursor) as cursor:
            cursor.execute("EXPLAIN " + cursor.mogrify(statement, parameters))
            rows = cursor.fetchall()
        raw.close()
        shown[name] = "; ".join(
            f"{row['type']} on {row['key']} ({row['rows']} rows"
            + (f", {row['Extra']})" if row["Extra"] else ")")
            for row in rows
            if row["table"]
        )
    engine.dispose()
    return shown


def sweep(url: str, count: int) -> dict[str, Any]:
    """sweep_retention of the oldest fifth of the runs (90% of them terminal)."""
    engine = create_engine(url)
    projection = RunProjection(engine)
    cutoff = T0 + timedelta(seconds=count // 5)
    expected = projection.count_sweepable(cutoff)
    started = time.perf_counter()
    deleted = projection.sweep_retention(cutoff)
    seconds = time.perf_counter() - started
    engine.dispose()
    assert len(deleted) == expected, (len(deleted), expected)
    return {"deleted": len(deleted), "seconds": seconds, "runs_per_s": len(deleted) / seconds}


def measure(count: int, rounds: int, block: int) -> dict[str, Any]:
    with database() as url:
        upgrade(url)
        started = time.perf_counter()
        load(url, count)
        loaded = time.perf_counter() - started
        engine = sa.create_engine(url, poolclass=NullPool)
        with engine.connect() as connection:
            version = connection.exec_driver_sql("SELECT VERSION()").scalar_one()
        engine.dispose()
        return {
            "server": version,
            "runs": count,
            "load_seconds": loaded,
            "operations": measure_operations(url, count, rounds, block),
            "plans": plans(url, count),
            "sweep": sweep(url, count),
        }


def render(result: dict[str, Any]) -> str:
    lines = [
        "",
        f"### MariaDB ({result['server']}, {result['runs']:,} runs): "
        "layer vs bare Core vs raw PyMySQL, same SQL",
        "",
        "| operation | layer µs/call | bare Core µs/call | raw PyMySQL µs/call "
        "| layer / bare Core | layer / raw |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, numbers in result["operations"].items():
        lines.append(
            f"| `{name}` | {numbers['layer_us']:,.0f} | {numbers['bare_us']:,.0f} "
            f"| {numbers['raw_us']:,.0f} | {numbers['bare_ratio']:.2f}x "
            f"| {numbers['ratio']:.2f}x |"
        )
    lines += [
        "",
        "Medians of blocks taking turns (layer, bare Core, raw). Bare Core "
        "(benchmarks/bare_core.py): the layer's statements on a plain engine, one held "
        "connection per role, reads in AUTOCOMMIT (so no ROLLBACK after them); raw PyMySQL "
        "replays what the layer sent, a read followed by the ROLLBACK the pool sends.",
    ]
    lines += ["", "| statement | MariaDB's plan |", "| --- | --- |"]
    lines += [f"| {name} | {plan} |" for name, plan in result["plans"].items()]
    swept = result["sweep"]
    lines += [
        "",
        f"sweep_retention: {swept['deleted']:,} runs in {swept['seconds']:.2f} s "
        f"({swept['runs_per_s']:,.0f} runs/s)",
    ]
    return "\n".join(lines)
