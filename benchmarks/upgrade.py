"""Section "upgrade": ``alembic upgrade head`` while services keep writing (issue 20).

For each server backend and each earlier revision: load N runs (one in ten
active, each active run with a node binding) at that revision, start four
threads calling ``insert_start``, ``update_node`` and ``update_state``
through ``RunProjection``, run the deployer's ``alembic upgrade head`` (the
two-line alembic.ini) in a process of its own, and report how long the
upgrade took, the longest single API call while it ran, the calls made
meanwhile and the errors. Reports; never gates.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from relay_flow_projection import RunProjection, RunStart, create_engine, upgrade

from . import mariadb
from .dataset import PostgresDatabases

FROM_REVISIONS = ("0003_generation_3", "0004_adopt_legacy_rows")
WRITERS = 4
ALEMBIC = Path(sys.executable).parent / "alembic"
T0 = datetime(2026, 1, 1, tzinfo=UTC)

# N runs made server-side from a series 1..N: ids in load order, one in ten
# active (running, at a node), the rest completed 30 s after they started.
_RUN_SELECT = """
    SELECT {id}, {id}, 1, {mod3_repo}, {mod5_wf}, {ticket}, {key},
           CASE WHEN MOD(n, 10) = 0 THEN 'running' ELSE 'completed' END,
           CASE WHEN MOD(n, 10) = 0 THEN 'build' END,
           CASE WHEN MOD(n, 10) = 0 THEN {visit} END,
           {started}, {started},
           CASE WHEN MOD(n, 10) = 0 THEN NULL ELSE {finished} END
    FROM {series}"""
_RUN_COLUMNS = (
    "id, logical_run_id, attempt_id, repo, workflow, ticket_id, ticket_key, state, "
    "current_node, current_node_visit_id, started_at, updated_at, finished_at"
)
_RUNTIME_SELECT = """
    SELECT {id}, 'build', NULL, NULL, {visit}, {started} FROM {series} WHERE MOD(n, 10) = 0"""
_RUNTIME_COLUMNS = "run_id, node, terminal_id, session_id, node_visit_id, updated_at"


def _postgres_sql(count: int) -> dict[str, str]:
    started = "timestamptz '2026-01-01 00:00:00+00' + n * interval '1 second'"
    return {
        "id": "'run-' || lpad(n::text, 8, '0')",
        "mod3_repo": "'repo-' || (MOD(n, 3))",
        "mod5_wf": "'wf-' || (MOD(n, 5))",
        "ticket": "'T-' || n",
        "key": "'KEY-' || n",
        "visit": "'v-' || n",
        "started": started,
        "finished": f"{started} + interval '30 seconds'",
        "series": f"generate_series(1, {count}) AS s(n)",
    }


def _mysql_sql(count: int) -> dict[str, str]:
    started = "TIMESTAMPADD(SECOND, n, TIMESTAMP '2026-01-01 00:00:00')"
    return {
        "id": "CONCAT('run-', LPAD(n, 8, '0'))",
        "mod3_repo": "CONCAT('repo-', MOD(n, 3))",
        "mod5_wf": "CONCAT('wf-', MOD(n, 5))",
        "ticket": "CONCAT('T-', n)",
        "key": "CONCAT('KEY-', n)",
        "visit": "CONCAT('v-', n)",
        "started": started,
        "finished": f"TIMESTAMPADD(SECOND, 30, {started})",
        # MariaDB's Sequence engine: a table of 1..N, nothing stored.
        "series": f"(SELECT seq AS n FROM seq_1_to_{int(count)}) AS s",  # noqa: S608
    }


def load(url: str, revision: str, count: int, family: str) -> None:
    """The database at *revision* holding *count* runs, analyzed."""
    upgrade(url, revision)
    parts = _postgres_sql(count) if family == "postgresql" else _mysql_sql(count)
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            f"INSERT INTO relay_runs ({_RUN_COLUMNS}) {_RUN_SELECT.format(**parts)}"
        )
        connection.exec_driver_sql(
            f"INSERT INTO relay_node_runtime ({_RUNTIME_COLUMNS}) {_RUNTIME_SELECT.format(**parts)}"
        )
    analyze = "ANALYZE" if family == "postgresql" else "ANALYZE TABLE relay_runs"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(analyze)
    engine.dispose()


@dataclass
class Writers:
    """WRITERS threads writing through the API; each call timed."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    calls: list[tuple[float, float]] = field(default_factory=list)  # (ended, seconds)
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, number: int) -> None:
        engine = create_engine(self.url)
        projection = RunProjection(engine)
        try:
            for index in range(10**9):
                if self.stop.is_set():
                    return
                run_id = f"live-{number}-{index}"
                start = RunStart(run_id, "repo-0", "wf-0", f"T-{run_id}", f"K-{run_id}")
                self._timed(projection.insert_start, start, T0)
                self._timed(projection.update_node, run_id, "running", "build", "v1")
                self._timed(projection.update_state, run_id, "completed")
        finally:
            engine.dispose()

    def _timed(self, call: Callable[..., None], *arguments: Any) -> None:
        started = time.monotonic()
        try:
            call(*arguments)
        except Exception as exc:  # counted and reported, never raised
            with self.lock:
                self.errors[type(exc).__name__] += 1
            time.sleep(0.01)
            return
        ended = time.monotonic()
        with self.lock:
            self.calls.append((ended, ended - started))


def upgrade_while_writing(url: str) -> dict[str, Any]:
    """Run `alembic upgrade head` (the deployer's two-line ini) with writers going."""
    writers = Writers(url)
    threads = [threading.Thread(target=writers.run, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # writers warmed up, connections pooled
    with tempfile.TemporaryDirectory(prefix="relay-upgrade-") as directory:
        Path(directory, "alembic.ini").write_text(
            "[alembic]\nscript_location = relay_flow_projection:migrations\n"
        )
        started = time.monotonic()
        done = subprocess.run(
            [str(ALEMBIC), "-x", f"url={url}", "upgrade", "head"],
            cwd=directory,
            capture_output=True,
            text=True,
            check=False,
        )
        ended = time.monotonic()
    writers.stop.set()
    for thread in threads:
        thread.join()
    if done.returncode != 0:
        raise RuntimeError(f"alembic upgrade head failed: {done.stdout}{done.stderr}")
    during = [seconds for finished, seconds in writers.calls if started <= finished <= ended]
    return {
        "upgrade_seconds": ended - started,
        "longest_call_ms": max(during, default=0.0) * 1000,
        "calls": len(during),
        "errors": dict(writers.errors),
        "lock_retries": done.stderr.count("retrying in"),
    }


@contextmanager
def _postgres_database(databases: PostgresDatabases) -> Iterator[str]:
    name = databases.create(f"upgrade_{uuid.uuid4().hex[:8]}")
    try:
        yield databases.url(name)
    finally:
        databases.drop(name)


def measure(
    runs: int, postgres: PostgresDatabases | None, with_mysql: bool
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for revision in FROM_REVISIONS:
        if postgres is not None:
            with _postgres_database(postgres) as url:
                load(url, revision, runs, "postgresql")
                rows.append({"backend": "PostgreSQL", "from": revision, "runs": runs,
                             **upgrade_while_writing(url)})  # fmt: skip
        if with_mysql:
            with mariadb.database() as url:
                load(url, revision, runs, "mysql")
                rows.append({"backend": "MariaDB", "from": revision, "runs": runs,
                             **upgrade_while_writing(url)})  # fmt: skip
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "",
        f"Upgrade to head while {WRITERS} threads write through the API "
        "(insert_start, update_node, update_state):",
        "",
        "| backend | from revision | runs | upgrade took | longest API call during it "
        "| calls during it | errors | lock retries |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        errors = sum(row["errors"].values())
        named = ", ".join(f"{name} {count}" for name, count in row["errors"].items())
        lines.append(
            f"| {row['backend']} | {row['from']} | {row['runs']:,} | "
            f"{row['upgrade_seconds']:.1f} s | {row['longest_call_ms']:,.0f} ms | "
            f"{row['calls']:,} | {errors}{f' ({named})' if named else ''} | "
            f"{row['lock_retries']} |"
        )
    return "\n".join(lines)
