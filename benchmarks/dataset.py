"""The benchmark data set, and fresh databases to hold it.

One deterministic shape, written identically to SQLite and PostgreSQL:

- ``runs`` runs ``run-00000000`` ... in ``started_at`` order (one second
  apart), in 100 workflows and 10 repos;
- the oldest tenth are terminal and finished before :attr:`Shape.cutoff`:
  exactly what ``sweep_retention(cutoff)`` removes;
- 1% of the runs are active (about ``runs / 10_000`` per workflow, ~100 at 1M),
  spread over the whole table, all younger than the sweepable tenth; the rest
  are terminal (every seventh canceled, the others completed);
- every run has its child rows: one node runtime binding ("build"), one
  processed report and one node session.

The retention sweep runs on a *mixed* shape (``Shape(runs, mixed=True)``, a
template of its own): 10% of the runs are active, one in every ten
consecutive runs (at a varying position) through the whole table, the old
ones included; the oldest ``runs / 10`` terminal runs are what
``sweep_retention(cutoff)`` removes, interleaved with active runs that it
must step over. ``Shape(runs, mixed=True, old=n)`` makes the oldest *n*
terminal runs sweepable instead (``benchmarks/run.py --sweepable n``).

The schema always comes from the project's own Alembic chain; rows are bulk
loaded with the raw drivers (loading is not what is measured). A *template*
is loaded once per dialect and copied for every section, so each section gets
a fresh database without paying for the load again.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from relay_flow_projection import upgrade
from relay_flow_projection.timestamps import to_storage_text

BASE_TIME = datetime(2025, 1, 1, tzinfo=UTC)
RUN_LIFETIME = timedelta(seconds=30)
WORKFLOWS = 100
REPOS = 10
ACTIVE_STATES = ("running", "waiting", "blocked", "starting", "canceling")

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
POSTGRES_URL_VARIABLE = "RELAY_FLOW_BENCH_POSTGRES_URL"


def run_id(index: int) -> str:
    return f"run-{index:08d}"


@dataclass(frozen=True, slots=True)
class Shape:
    runs: int
    mixed: bool = False  # 10% active runs through the whole table (the sweep's data set)
    old: int = 0  # terminal runs older than the cutoff; 0: a tenth of the runs

    @property
    def sweepable(self) -> int:
        return self.old or self.runs // 10

    @property
    def old_end(self) -> int:
        """The runs below this index finished before :attr:`cutoff`."""
        if not self.mixed:
            return self.sweepable
        index, terminal = 10 * (self.sweepable // 9), 9 * (self.sweepable // 9)
        while terminal < self.sweepable:
            terminal += not self.is_active(index)
            index += 1
        return index

    @property
    def cutoff(self) -> datetime:
        """``sweep_retention(cutoff)`` removes exactly ``sweepable`` terminal runs."""
        return BASE_TIME + timedelta(seconds=self.old_end) + RUN_LIFETIME

    def is_active(self, index: int) -> bool:
        if self.mixed:
            # One run in each ten consecutive ones, at a position that varies.
            return (7 * index + index // 10) % 10 == 3
        return index >= self.sweepable and (index // WORKFLOWS) % 90 == 37

    def active_indexes(self) -> Iterator[int]:
        start = 0 if self.mixed else self.sweepable
        return (i for i in range(start, self.runs) if self.is_active(i))

    def workflow_of(self, index: int) -> str:
        return f"workflow-{index % WORKFLOWS}"

    def run_row(self, i: int) -> tuple[Any, ...]:
        """The relay_runs row of run *i*, timestamps as aware datetimes (columns: RUN_COLUMNS)."""
        started = BASE_TIME + timedelta(seconds=i)
        active = self.is_active(i)
        if active:
            state = ACTIVE_STATES[(i // 9_000) % len(ACTIVE_STATES)]
        else:
            state = "canceled" if i % 7 == 0 else "completed"
        rid = run_id(i)
        return (
            rid,
            rid,
            1,
            f"repo-{i % REPOS}",
            self.workflow_of(i),
            f"T-{i}",
            f"KEY-{i % 50_000}",
            state,
            "build" if active else None,
            f"visit-{i}" if active else None,
            "canceled by user" if state == "canceled" else None,
            started,
            started + RUN_LIFETIME,
            None if active else started + RUN_LIFETIME,
        )

    def run_rows(self) -> Iterator[tuple[Any, ...]]:
        return (self.run_row(i) for i in range(self.runs))

    def child_row(self, i: int) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
        """(node runtime, processed report, node session) of run *i* (columns: CHILD_COLUMNS)."""
        rid = run_id(i)
        at = BASE_TIME + timedelta(seconds=i) + RUN_LIFETIME
        visit = f"visit-{i}"
        return (
            (rid, "build", None, f"session-{i}", visit, at),
            (rid, f"report-{i}", visit, at),
            (rid, "build", f"session-{i}", visit, at),
        )

    def child_rows(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]]:
        return (self.child_row(i) for i in range(self.runs))


RUN_COLUMNS = (
    "id, logical_run_id, attempt_id, repo, workflow, ticket_id, ticket_key, state, "
    "current_node, current_node_visit_id, last_error, started_at, updated_at, finished_at"
)
CHILD_COLUMNS = {
    "relay_node_runtime": "run_id, node, terminal_id, session_id, node_visit_id, updated_at",
    "relay_processed_reports": "run_id, report_id, node_visit_id, created_at",
    "relay_node_sessions": "run_id, node, session_id, node_visit_id, created_at",
}
CHILD_TABLES = tuple(CHILD_COLUMNS)


def _sqlite_text(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(to_storage_text(v) if isinstance(v, datetime) else v for v in row)


def _marks(columns: str) -> str:
    return ", ".join("?" for _ in columns.split(","))


# --------------------------------------------------------------- SQLite ---


def load_sqlite(path: Path, shape: Shape) -> None:
    """Upgrade an empty file to head, then bulk-load *shape* (one transaction per table)."""
    upgrade(path)
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA synchronous = OFF")
        connection.execute("PRAGMA cache_size = -262144")
        connection.execute("BEGIN")
        connection.executemany(
            f"INSERT INTO relay_runs ({RUN_COLUMNS}) VALUES ({_marks(RUN_COLUMNS)})",  # noqa: S608
            (_sqlite_text(row) for row in shape.run_rows()),
        )
        connection.execute("COMMIT")
        for position, table in enumerate(CHILD_TABLES):
            columns = CHILD_COLUMNS[table]
            connection.execute("BEGIN")
            connection.executemany(
                f"INSERT INTO {table} ({columns}) VALUES ({_marks(columns)})",  # noqa: S608
                (_sqlite_text(rows[position]) for rows in shape.child_rows()),
            )
            connection.execute("COMMIT")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


def copy_sqlite(template: Path, destination: Path) -> None:
    """A fresh database file with the template's content (the template is checkpointed).

    The copy is flushed to disk here: otherwise the first fsync of the measured
    section (a WAL checkpoint) would pay for writing back the whole copy.
    """
    for suffix in ("-wal", "-shm"):  # a stale WAL would be replayed into the copy
        Path(f"{destination}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(template, destination)
    os.chmod(destination, 0o600)
    descriptor = os.open(destination, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# ----------------------------------------------------------- PostgreSQL ---


def postgres_admin_url() -> sa.URL:
    return make_url(os.environ.get(POSTGRES_URL_VARIABLE, DEFAULT_POSTGRES_URL))


def _libpq(url: sa.URL) -> str:
    """The psycopg connection string of a SQLAlchemy URL."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_available() -> str | None:
    """None when the server answers, else the reason."""
    try:
        with psycopg.connect(_libpq(postgres_admin_url()), connect_timeout=5):
            return None
    except psycopg.Error as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class PostgresDatabases:
    """Creates ``relay_bench_<pid>_<tag>`` databases and drops every one at the end."""

    def __init__(self) -> None:
        self.prefix = f"relay_bench_{os.getpid()}"
        self.created: list[str] = []

    def url(self, name: str) -> str:
        return postgres_admin_url().set(database=name).render_as_string(hide_password=False)

    def libpq(self, name: str) -> str:
        return _libpq(postgres_admin_url().set(database=name))

    def _admin(self, statement: str) -> None:
        with psycopg.connect(_libpq(postgres_admin_url()), autocommit=True) as connection:
            connection.execute(statement.encode())

    def server_version(self) -> str:
        with psycopg.connect(_libpq(postgres_admin_url())) as connection:
            row = connection.execute(b"SHOW server_version").fetchone()
        return str(row[0]).split()[0] if row else "?"

    def create(self, tag: str, template: str | None = None) -> str:
        name = f"{self.prefix}_{tag}"
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        # FILE_COPY, then a checkpoint: PostgreSQL 15's default WAL_LOG strategy
        # would write the whole copy through the WAL, to be flushed during the
        # measured section.
        suffix = f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""
        self._admin(f'CREATE DATABASE "{name}"{suffix}')
        if template:
            self._admin("CHECKPOINT")
        self.created.append(name)
        return name

    def drop(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def drop_all(self) -> None:
        for name in list(self.created):
            self.drop(name)


def load_postgres(databases: PostgresDatabases, name: str, shape: Shape) -> None:
    """Upgrade the database to head, then COPY *shape* in and VACUUM ANALYZE it.

    The foreign-key triggers are skipped during the load (session_replication_role);
    the rows satisfy them by construction.
    """
    upgrade(databases.url(name))
    with psycopg.connect(databases.libpq(name)) as connection:
        connection.execute("SET session_replication_role = replica")
        with connection.cursor() as cursor:
            with cursor.copy(f"COPY relay_runs ({RUN_COLUMNS}) FROM STDIN".encode()) as copy:
                for row in shape.run_rows():
                    copy.write_row(row)
            for position, table in enumerate(CHILD_TABLES):
                statement = f"COPY {table} ({CHILD_COLUMNS[table]}) FROM STDIN"
                with cursor.copy(statement.encode()) as copy:
                    for rows in shape.child_rows():
                        copy.write_row(rows[position])
        connection.commit()
    with psycopg.connect(databases.libpq(name), autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
        connection.execute("CHECKPOINT")
