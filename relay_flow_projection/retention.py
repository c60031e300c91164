"""Retention: sweeping old terminal runs in time-sized, set-based batches, with an archive.

``Sweep`` is one ``sweep_retention`` call. Each ``run_batch`` runs inside one
write transaction that the facade's executor opened (execution.py): it picks
the next batch, writes it to the archive (if any) and flushes before deleting,
so a batch that commits is always archived first. A batch interrupted before
its commit may be archived again by the next sweep: a run can appear twice in
an archive, never zero times.

Batch size follows measured time: each batch aims to hold the write lock
(SQLite) or its row locks (PostgreSQL) for about ``target_batch_seconds``,
growing or shrinking from what the previous batch took, never above
``batch_size``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import time
from datetime import datetime
from functools import cache
from typing import Any, BinaryIO

from sqlalchemy import Delete, and_, bindparam, delete, func, select
from sqlalchemy.engine import Connection

from . import validation as check
from .dialect import always_cascades, matches_any
from .schema import RUN_CHILD_TABLES, is_terminal, runs
from .timestamps import UtcDateTime, require_aware

DEFAULT_TARGET_BATCH_SECONDS = 0.075
_FIRST_BATCH = 200

_SWEEPABLE = and_(
    is_terminal,
    runs.c.finished_at.is_not(None),
    runs.c.finished_at < bindparam("older_than", type_=UtcDateTime()),
)
COUNT_SWEEPABLE = select(func.count()).select_from(runs).where(_SWEEPABLE)
# FOR UPDATE (PostgreSQL) keeps a concurrent writer from reviving a run between
# choosing it and deleting it; SQLite's BEGIN IMMEDIATE already excludes writers.
SELECT_SWEEPABLE = (
    select(runs.c.id)
    .where(_SWEEPABLE)
    .order_by(runs.c.finished_at)
    .limit(bindparam("batch_size"))
    .with_for_update()
)


@cache
def _delete_runs_statements(dialect: str) -> tuple[Delete, ...]:
    """Children first, one set-based DELETE per table, then the runs themselves.

    Keyed by dialect name (a str keeps no engine alive). Explicit child
    deletes keep the sweep correct on a SQLite connection without foreign
    keys; where the cascade always runs (PostgreSQL) the runs' DELETE alone
    removes the children (sweep of 100,000 runs: 5.5 -> 4.1 s).
    """
    parents = delete(runs).where(matches_any(dialect, runs.c.id, "ids"))
    if always_cascades(dialect):
        return (parents,)
    children = tuple(
        delete(table).where(matches_any(dialect, table.c.run_id, "ids"))
        for table in RUN_CHILD_TABLES
    )
    return (*children, parents)


@cache
def _child_selects(dialect: str) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (
            table.name,
            select(table)
            .where(matches_any(dialect, table.c.run_id, "ids"))
            .order_by(*table.primary_key),
        )
        for table in RUN_CHILD_TABLES
    )


@cache
def _run_rows(dialect: str) -> Any:
    return select(runs).where(matches_any(dialect, runs.c.id, "ids")).order_by(runs.c.id)


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


class Sweep:
    """One sweep_retention call (see the module docstring)."""

    def __init__(
        self,
        older_than: datetime,
        *,
        batch_size: int,
        target_batch_seconds: float = DEFAULT_TARGET_BATCH_SECONDS,
        archive: str | os.PathLike[str] | BinaryIO | None = None,
    ) -> None:
        self._cutoff = require_aware(older_than, "older_than")
        self._max = check.positive(batch_size, "batch_size")
        if isinstance(target_batch_seconds, bool) or not isinstance(
            target_batch_seconds, int | float
        ):
            raise TypeError("target_batch_seconds must be a number of seconds")
        if not (0 < target_batch_seconds < math.inf):
            raise ValueError(f"target_batch_seconds must be positive, got {target_batch_seconds}")
        self._target = float(target_batch_seconds)
        self._size = min(self._max, _FIRST_BATCH)
        self._archive: Any = None  # a binary file: the caller's, or gzip/open of a path
        self._owns_archive = False
        if archive is not None:
            if isinstance(archive, str | os.PathLike):
                path = os.fspath(archive)
                self._archive = gzip.open(path, "ab") if path.endswith(".gz") else open(path, "ab")  # noqa: SIM115
                self._owns_archive = True
            elif isinstance(archive, io.IOBase) or hasattr(archive, "write"):
                self._archive = archive
            else:
                raise TypeError(
                    "archive must be a path or a writable binary file, "
                    f"not {type(archive).__name__}"
                )
        self.done = False
        self.longest_batch_seconds = 0.0

    def run_batch(self, conn: Connection) -> list[str]:
        started = time.monotonic()
        size = self._size
        params = {"older_than": self._cutoff, "batch_size": size}
        ids = list(conn.execute(SELECT_SWEEPABLE, params).scalars())
        dialect = conn.dialect.name
        if ids:
            if self._archive is not None:
                self._write_archive(conn, dialect, ids)
            for statement in _delete_runs_statements(dialect):
                conn.execute(statement, {"ids": ids})
        self.done = len(ids) < size
        elapsed = time.monotonic() - started
        self.longest_batch_seconds = max(self.longest_batch_seconds, elapsed)
        if ids:
            # Aim the next batch at the target, changing by at most 2x per step.
            per_run = elapsed / len(ids)
            wanted = int(self._target / per_run) if per_run > 0 else self._max
            self._size = max(1, min(self._max, size * 2, max(size // 2, wanted)))
        return ids

    def _write_archive(self, conn: Connection, dialect: str, ids: list[str]) -> None:
        assert self._archive is not None
        children: dict[str, dict[str, list[dict[str, Any]]]] = {run_id: {} for run_id in ids}
        for name, statement in _child_selects(dialect):
            for row in conn.execute(statement, {"ids": ids}).mappings():
                record = {key: _jsonable(value) for key, value in row.items()}
                children[row["run_id"]].setdefault(name, []).append(record)
        lines = []
        for row in conn.execute(_run_rows(dialect), {"ids": ids}).mappings():
            line = {
                "run": {key: _jsonable(value) for key, value in row.items()},
                **{
                    table.name: children[row["id"]].get(table.name, [])
                    for table in RUN_CHILD_TABLES
                },
            }
            lines.append(json.dumps(line, sort_keys=True, ensure_ascii=False).encode() + b"\n")
        self._archive.write(b"".join(lines))
        self._archive.flush()  # written before the batch that deletes these runs commits

    def close(self) -> None:
        if self._owns_archive and self._archive is not None:
            self._archive.close()
        self._archive = None
