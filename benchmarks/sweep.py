"""3. Retention: ``sweep_retention`` against the Go release's algorithm.

Both run on copies of the *mixed* data set (``Shape(runs, mixed=True)``): 10%
of the runs active, spread through the whole table, and ``runs / 10`` old
terminal runs (3 child rows each; ``--sweepable`` sets another count) to
sweep from among them.

- ``sweep_layer``: ``RunProjection.sweep_retention`` with its defaults (time-sized
  batches aiming at ``target_batch_seconds``, at most ``batch_size`` runs).
  Every write transaction's hold is timed from the outside, through engine
  events: from ``BEGIN`` (SQLite: once ``BEGIN IMMEDIATE`` has the write lock)
  to the end of its ``COMMIT`` (lock_holds.py) -- so the commit
  and any WAL checkpoint it runs count, as they do for a waiting writer. With
  ``archive=True`` the sweep also writes its archive, and every line is
  checked against the data set afterwards.
- ``sweep_go``: the Go release's ``sweepRetention`` on the raw driver: select
  every id, then one transaction per run deleting its children one table at
  a time, then the run. On SQLite either with the layer's pragmas or with the
  Go release's own (its DSN: ``journal_mode=WAL`` and ``BEGIN IMMEDIATE``
  transactions, everything else SQLite's default: ``synchronous=FULL``,
  ``foreign_keys`` off).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from relay_flow_projection import RunProjection, create_engine
from relay_flow_projection.engine import BUSY_TIMEOUT_MS, JOURNAL_SIZE_LIMIT
from relay_flow_projection.retention import DEFAULT_TARGET_BATCH_SECONDS
from relay_flow_projection.schema import runs as runs_table
from relay_flow_projection.timestamps import to_storage_text

from .dataset import CHILD_COLUMNS, CHILD_TABLES, RUN_COLUMNS, Shape
from .lock_holds import LockHolds
from .sections import Target


def _child_rows(target: Target) -> int:
    counts = [f"(SELECT count(*) FROM {table})" for table in CHILD_TABLES]  # noqa: S608
    query = "SELECT " + " + ".join(counts)
    if target.dialect == "sqlite":
        connection = sqlite3.connect(target.conninfo)
        try:
            return int(connection.execute(query).fetchone()[0])
        finally:
            connection.close()
    with psycopg.connect(target.conninfo, autocommit=True) as pg:
        row = pg.execute(query.encode()).fetchone()
        return int(row[0]) if row else 0


def _expected_line(shape: Shape, index: int) -> dict[str, Any]:
    """The archive line sweep_retention must write for run *index* of the data set."""

    def jsonable(values: tuple[Any, ...], columns: str) -> dict[str, Any]:
        names = [name.strip() for name in columns.split(",")]
        return {
            name: value.isoformat() if hasattr(value, "isoformat") else value
            for name, value in zip(names, values, strict=True)
        }

    run = dict.fromkeys(runs_table.c.keys())
    run.update(jsonable(shape.run_row(index), RUN_COLUMNS))
    children = shape.child_row(index)
    return {
        "run": run,
        **{
            table: [jsonable(children[position], CHILD_COLUMNS[table])]
            for position, table in enumerate(CHILD_TABLES)
        },
    }


def verify_archive(path: Path, shape: Shape, swept: list[str]) -> dict[str, Any]:
    """Every swept run in the archive exactly once, exactly as the data set has it."""
    wanted = set(swept)
    seen: set[str] = set()
    lines = unparsable = unexpected = duplicates = different = 0
    with path.open("rb") as archive:
        for raw in archive:
            lines += 1
            try:
                line = json.loads(raw)
                run_id = line["run"]["id"]
            except (ValueError, KeyError, TypeError):
                unparsable += 1
                continue
            if run_id not in wanted:
                unexpected += 1
            elif run_id in seen:
                duplicates += 1
            elif line != _expected_line(shape, int(run_id.rsplit("-", 1)[1])):
                different += 1
            seen.add(run_id)
    missing = len(wanted - seen)
    return {
        "archive_lines": lines,
        "archive_bytes": path.stat().st_size,
        "archive_unparsable": unparsable,
        "archive_missing": missing,
        "archive_unexpected": unexpected,
        "archive_duplicates": duplicates,
        "archive_different": different,
        "archive_ok": lines == len(wanted)
        and not (unparsable or missing or unexpected or duplicates or different),
    }


def sweep_layer(
    target: Target,
    runs: int,
    batch_size: int | None = None,
    archive: bool = False,
    old: int = 0,
) -> dict[str, Any]:
    shape = Shape(runs, mixed=True, old=old)
    children_before = _child_rows(target)
    engine = create_engine(target.url)
    projection = RunProjection(engine)
    active_before = _active(projection)
    holds = LockHolds(engine)
    options: dict[str, Any] = {} if batch_size is None else {"batch_size": batch_size}
    with tempfile.TemporaryDirectory(prefix="relay_sweep_archive_") as directory:
        path = Path(directory) / "swept.jsonl"
        if archive:
            options["archive"] = path
        started, cpu = time.perf_counter(), time.process_time()
        deleted = projection.sweep_retention(shape.cutoff, **options)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        batches = list(holds.seconds)
        checked = verify_archive(path, shape, deleted) if archive else {}
    remaining = projection.count_sweepable(shape.cutoff)
    active_after = _active(projection)
    engine.dispose()
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "runs_deleted": len(deleted),
        "children_deleted": children_before - _child_rows(target),
        "remaining_sweepable": remaining,
        "active_kept": active_after == active_before == sum(1 for _ in shape.active_indexes()),
        "batches": len(batches),
        "longest_batch_s": max(batches, default=0.0),
        "median_batch_s": statistics.median(batches) if batches else 0.0,
        "target_batch_s": DEFAULT_TARGET_BATCH_SECONDS,
        "mean_batch_runs": len(deleted) / max(1, len(batches)),
        **checked,
    }


def _active(projection: RunProjection) -> int:
    return sum(count for state, count in projection.count_runs().items() if not state.is_terminal)


# The Go release's statements (projection.go, sweepRetention), verbatim but for placeholders.
GO_SELECT = (
    "SELECT id FROM relay_runs WHERE state IN ('completed', 'canceled') "
    "AND finished_at IS NOT NULL AND finished_at < ?"
)
GO_DELETES = (
    "DELETE FROM relay_processed_reports WHERE run_id = ?",
    "DELETE FROM relay_node_sessions WHERE run_id = ?",
    "DELETE FROM relay_node_runtime WHERE run_id = ?",
    "DELETE FROM relay_runs WHERE id = ?",
)
# SQLite connection settings: the layer's (engine.py), or the Go release's own
# (openProjectionDatabase: "file:...?_txlock=immediate", then journal_mode=WAL).
SQLITE_PRAGMAS = {
    "layer": (
        f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
        "PRAGMA foreign_keys = ON",
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = NORMAL",
        f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}",
    ),
    "go": ("PRAGMA journal_mode = WAL",),
}


def sweep_go(target: Target, runs: int, pragmas: str = "layer", old: int = 0) -> dict[str, Any]:
    """The Go algorithm on the raw driver: select every id, then one transaction per run."""
    shape = Shape(runs, mixed=True, old=old)
    children_before = _child_rows(target)
    settings: dict[str, Any] = {}
    started, cpu = time.perf_counter(), time.process_time()
    if target.dialect == "sqlite":
        connection = sqlite3.connect(target.conninfo, isolation_level=None)
        for pragma in SQLITE_PRAGMAS[pragmas]:
            connection.execute(pragma)
        for name in ("synchronous", "foreign_keys", "journal_mode"):
            settings[name] = connection.execute(f"PRAGMA {name}").fetchone()[0]
        cutoff = to_storage_text(shape.cutoff)
        ids = [row[0] for row in connection.execute(GO_SELECT, (cutoff,))]
        for rid in ids:
            connection.execute("BEGIN IMMEDIATE")  # the DSN's _txlock=immediate
            for statement in GO_DELETES:
                connection.execute(statement, (rid,))
            connection.execute("COMMIT")
        connection.close()
    else:
        with psycopg.connect(target.conninfo) as pg:
            ids = [row[0] for row in pg.execute(GO_SELECT.replace("?", "%s"), (shape.cutoff,))]
            pg.commit()
            deletes = [statement.replace("?", "%s") for statement in GO_DELETES]
            for rid in ids:
                for statement in deletes:
                    pg.execute(statement.encode(), (rid,))
                pg.commit()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,  # this process only: PostgreSQL's own work is the server's
        "pragmas": pragmas,
        "settings": settings,
        "runs_deleted": len(ids),
        "children_deleted": children_before - _child_rows(target),
    }
