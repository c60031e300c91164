"""Build the unversioned SQLite databases that relay-flow's Go releases left behind.

Used by the adoption tests and by the benchmarks. Everything is written with
the plain ``sqlite3`` module, foreign keys off (as the Go driver ran), using
the Go releases' own DDL and Go's timestamp text layout (LEGACY.md).
Also: the schema comparison `alembic check` runs, for adopted and migrated
databases alike (:func:`schema_drift`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from relay_flow_projection.migration_env import include_name
from relay_flow_projection.schema import metadata

RUNS_GENERATION_1 = """
CREATE TABLE IF NOT EXISTS relay_runs (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL,
    workflow TEXT NOT NULL,
    ticket_id TEXT NOT NULL,
    ticket_key TEXT NOT NULL,
    state TEXT NOT NULL,
    current_node TEXT,
    current_node_visit_id TEXT,
    last_error TEXT,
    started_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL,
    finished_at DATETIME
);
"""

# A database created fresh at generation 2 has the retry columns before started_at.
RUNS_GENERATION_2 = """
CREATE TABLE IF NOT EXISTS relay_runs (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL,
    workflow TEXT NOT NULL,
    ticket_id TEXT NOT NULL,
    ticket_key TEXT NOT NULL,
    state TEXT NOT NULL,
    current_node TEXT,
    current_node_visit_id TEXT,
    last_error TEXT,
    retry_error TEXT,
    retry_attempt INTEGER,
    next_retry_at DATETIME,
    started_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL,
    finished_at DATETIME
);
"""

# relay-flow 0.2.5 (projection.go), created fresh.
RUNS_GENERATION_3 = """
CREATE TABLE IF NOT EXISTS relay_runs (
    id TEXT PRIMARY KEY,
    logical_run_id TEXT,
    attempt_id INTEGER,
    repo TEXT NOT NULL,
    workflow TEXT NOT NULL,
    ticket_id TEXT NOT NULL,
    ticket_key TEXT NOT NULL,
    state TEXT NOT NULL,
    current_node TEXT,
    current_node_visit_id TEXT,
    last_error TEXT,
    retry_error TEXT,
    retry_attempt INTEGER,
    next_retry_at DATETIME,
    started_at DATETIME NOT NULL,
    updated_at DATETIME NOT NULL,
    finished_at DATETIME
);
"""

RUN_INDEXES = """
CREATE INDEX IF NOT EXISTS relay_runs_ticket_key ON relay_runs (ticket_key);
CREATE INDEX IF NOT EXISTS relay_runs_workflow_state ON relay_runs (workflow, state);
CREATE INDEX IF NOT EXISTS relay_runs_repo_state ON relay_runs (repo, state);
"""

CHILD_TABLES = """
CREATE TABLE IF NOT EXISTS relay_node_runtime (
    run_id TEXT NOT NULL,
    node TEXT NOT NULL,
    terminal_id TEXT,
    session_id TEXT,
    node_visit_id TEXT NOT NULL,
    updated_at DATETIME NOT NULL,
    PRIMARY KEY (run_id, node),
    FOREIGN KEY (run_id) REFERENCES relay_runs(id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS relay_processed_reports (
    run_id TEXT NOT NULL,
    report_id TEXT NOT NULL,
    node_visit_id TEXT NOT NULL,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (run_id, report_id),
    FOREIGN KEY (run_id) REFERENCES relay_runs(id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS relay_node_sessions (
    run_id TEXT NOT NULL,
    node TEXT NOT NULL,
    session_id TEXT NOT NULL,
    node_visit_id TEXT NOT NULL,
    created_at DATETIME NOT NULL,
    PRIMARY KEY (run_id, node, session_id),
    FOREIGN KEY (run_id) REFERENCES relay_runs(id) ON DELETE CASCADE
);
"""

IDENTITY_TABLE = """
CREATE TABLE IF NOT EXISTS relay_executor_identity (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    executor_plugin TEXT NOT NULL,
    temporal_address TEXT,
    temporal_namespace TEXT
);
"""

ADD_RETRY_COLUMNS = """
ALTER TABLE relay_runs ADD COLUMN retry_error TEXT;
ALTER TABLE relay_runs ADD COLUMN retry_attempt INTEGER;
ALTER TABLE relay_runs ADD COLUMN next_retry_at DATETIME;
"""

ADD_ATTEMPT_COLUMNS = """
ALTER TABLE relay_runs ADD COLUMN logical_run_id TEXT;
ALTER TABLE relay_runs ADD COLUMN attempt_id INTEGER;
"""

# (generation, grown from the previous generation by the Go "add column" loop?)
SCHEMAS: Mapping[tuple[int, bool], str] = {
    (1, False): RUNS_GENERATION_1 + RUN_INDEXES,
    (2, False): RUNS_GENERATION_2 + RUN_INDEXES + CHILD_TABLES,
    (2, True): RUNS_GENERATION_1 + RUN_INDEXES + ADD_RETRY_COLUMNS + CHILD_TABLES,
    (3, False): IDENTITY_TABLE + RUNS_GENERATION_3 + RUN_INDEXES + CHILD_TABLES,
    (3, True): (
        RUNS_GENERATION_1
        + RUN_INDEXES
        + ADD_RETRY_COLUMNS
        + CHILD_TABLES
        + ADD_ATTEMPT_COLUMNS
        + IDENTITY_TABLE
    ),
}


def go_timestamp(value: datetime) -> str:
    """Text as Go's SQLite driver wrote it: layout ``2006-01-02 15:04:05.999999999-07:00``.

    The fraction keeps up to nine digits with trailing zeros trimmed (none at
    all when zero); the offset is the value's own. Python datetimes stop at
    microseconds, so nanosecond values are written with :func:`go_timestamp_ns`.
    """
    return go_timestamp_ns(value, value.microsecond * 1000)


def go_timestamp_ns(value: datetime, nanoseconds: int) -> str:
    offset = value.utcoffset()
    if offset is None:
        raise ValueError("Go always wrote an offset: pass an aware datetime")
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    zone = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    fraction = f"{nanoseconds:09d}".rstrip("0")
    dot = f".{fraction}" if fraction else ""
    return f"{value:%Y-%m-%d %H:%M:%S}{dot}{zone}"


def create_schema(path: Path, generation: int, *, grown: bool = False) -> None:
    """Create an unversioned database of *generation* (1-3), fresh or grown from older ones."""
    with sqlite3.connect(path) as connection:
        connection.executescript(SCHEMAS[(generation, grown)])
    connection.close()


def insert_rows(path: Path, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert rows (column -> value) exactly as given: no defaults, no conversions."""
    count = 0
    connection = sqlite3.connect(path)
    try:
        with connection:
            for row in rows:
                columns = ", ".join(row)
                marks = ", ".join("?" for _ in row)
                connection.execute(
                    f"INSERT INTO {table} ({columns}) VALUES ({marks})",
                    tuple(row.values()),
                )
                count += 1
    finally:
        connection.close()
    return count


def bulk_generation_1_runs(
    count: int, *, terminal_every: int = 2, start: datetime | None = None
) -> Iterator[tuple[Any, ...]]:
    """*count* generation-1 run rows in Go's text layout, for adoption at scale.

    Offsets and fraction lengths vary as they did in the wild: every third row
    is written at +05:30, every seventh has no fraction at all.
    """
    base = start or datetime(2026, 1, 1, tzinfo=UTC)
    india = timezone(timedelta(hours=5, minutes=30))
    for index in range(count):
        started = base + timedelta(seconds=index, microseconds=(index * 7919) % 1_000_000)
        if index % 7 == 0:
            started = started.replace(microsecond=0)
        shown = started.astimezone(india) if index % 3 == 0 else started
        text = go_timestamp(shown)
        terminal = index % terminal_every == 0
        yield (
            f"run-{index:08d}",
            f"repo-{index % 10}",
            f"workflow-{index % 100}",
            f"T-{index}",
            f"KEY-{index % 50_000}",
            "completed" if terminal else "running",
            None if terminal else "build",
            None if terminal else f"visit-{index}",
            "",
            text,
            text,
            text if terminal else None,
        )


def populate_generation_1(path: Path, count: int) -> None:
    """A generation-1 database of *count* runs (fast: one executemany transaction)."""
    create_schema(path, 1)
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        with connection:
            connection.executemany(
                "INSERT INTO relay_runs (id, repo, workflow, ticket_id, ticket_key, state, "
                "current_node, current_node_visit_id, last_error, started_at, updated_at, "
                "finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                bulk_generation_1_runs(count),
            )
    finally:
        connection.close()


def sqlite_dump(path: Path) -> list[str]:
    """The logical content of a SQLite file (schema and rows), for "nothing changed" checks."""
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def stored_versions(path: Path) -> list[str] | None:
    """alembic_version as a brand-new connection sees it; None when the table does not exist."""
    connection = sqlite3.connect(path)
    try:
        exists = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
        ).fetchone()
        if exists is None:
            return None
        return [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
    finally:
        connection.close()


def schema_drift(engine: Engine) -> list[Any]:
    """The differences `alembic check` would report (relay tables only, types compared)."""
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={"compare_type": True, "include_name": include_name, "target_metadata": metadata},
        )
        return list(compare_metadata(context, metadata))
