"""Query plans: listings, keyset pages, existence checks and retention use their indexes.

Each case runs a public method, records the statement the driver actually
received (whichever execution path the repository took), and asks the
database to plan exactly that statement with exactly those parameters:
``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN`` on PostgreSQL and MariaDB.

SQLite must walk the partial index in list order -- no temp b-tree sort, no
table scan -- with or without ``ANALYZE`` statistics. On PostgreSQL, whose
planner rightly prefers sequential scans on a small table, sequential scans
are disabled for the ``EXPLAIN``: the case then shows that the partial index
*can* answer the query, i.e. that the query's predicate matches the index's.
MariaDB has no partial indexes: the same indexes hold every run, and the
query must be answered from the expected one (after ``ANALYZE TABLE``), in
its order where the query sorts, never by a full scan.
No timing anywhere: speed is measured by ``benchmarks/run.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import psycopg
import pymysql
import pytest
from sqlalchemy.engine import Engine

from relay_flow_projection import RunFilter, RunProjection, create_engine
from relay_flow_projection.schema import runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNS = 3_000
Sent = list[tuple[str, Any]]


def _run_rows() -> list[dict[str, Any]]:
    """3,000 runs in 5 workflows and 3 repos; one in 40 active, the others finished."""
    rows = []
    for index in range(RUNS):
        started = T0 + timedelta(minutes=index)
        active = index % 40 == 0
        state = "running" if active else ("canceled" if index % 7 == 0 else "completed")
        rows.append(
            {
                "id": f"r{index:05d}",
                "logical_run_id": f"r{index:05d}",
                "attempt_id": 1,
                "repo": f"repo-{index % 3}",
                "workflow": f"wf-{index % 5}",
                "ticket_id": f"T-{index}",
                "ticket_key": f"KEY-{index}",
                "state": state,
                "started_at": started,
                "updated_at": started,
                "finished_at": None if active else started + timedelta(seconds=30),
            }
        )
    return rows


# What the driver received, recorded below SQLAlchemy (so every path is seen).
SENT: Sent = []


class _RecordingSQLiteCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        SENT.append((sql, parameters))
        return super().execute(sql, parameters)


class _RecordingSQLiteConnection(sqlite3.Connection):
    def cursor(self, factory: Any = _RecordingSQLiteCursor) -> Any:
        return super().cursor(factory)


class _RecordingPostgresCursor(psycopg.Cursor[Any]):
    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        SENT.append((query if isinstance(query, str) else bytes(query).decode(), params))
        return super().execute(query, params, **kwargs)


class _RecordingMySQLCursor(pymysql.cursors.Cursor):
    """Records the statement as PyMySQL sends it (parameters interpolated client-side)."""

    def execute(self, query: Any, args: Any = None) -> int:
        SENT.append((self.mogrify(query, args), None))
        return super().execute(query, args)


@dataclass
class Planned:
    projection: RunProjection
    engine: Engine
    dialect: str

    def sent_select(self, call: Callable[[RunProjection], object]) -> tuple[str, Any]:
        """The first SELECT on relay_runs that *call* sent to the driver."""
        SENT.clear()
        call(self.projection)
        for statement, parameters in SENT:
            normalized = " ".join(statement.split()).upper()
            if normalized.startswith("SELECT") and "FROM RELAY_RUNS" in normalized:
                return statement, parameters
        raise AssertionError(f"no SELECT on relay_runs among {SENT!r}")

    def plans(self, call: Callable[[RunProjection], object]) -> list[list[str]]:
        return self.plans_of(*self.sent_select(call))

    def plans_of(self, statement: str, parameters: Any) -> list[list[str]]:
        """SQLite: the plan without statistics, then after ANALYZE; PostgreSQL, MariaDB:
        analyzed."""
        if self.dialect != "sqlite":
            return [self._plan(statement, parameters)]
        unanalyzed = self._plan(statement, parameters)
        with self.engine.connect() as connection:
            connection.exec_driver_sql("ANALYZE")
            connection.commit()
        return [unanalyzed, self._plan(statement, parameters)]

    def _plan(self, statement: str, parameters: Any) -> list[str]:
        with self.engine.connect() as connection:
            if self.dialect == "sqlite":
                rows = connection.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + statement, tuple(parameters)
                ).fetchall()
                plan = [str(row[3]) for row in rows]
            elif self.dialect == "mysql":
                # One line per table: "<table> <access type> key=<index> <Extra>".
                result = connection.exec_driver_sql("EXPLAIN " + statement)
                plan = [
                    f"{row['table']} {row['type']} key={row['key']} {row['Extra'] or ''}"
                    for row in result.mappings()
                ]
            else:
                connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
                rows = connection.exec_driver_sql(
                    "EXPLAIN (COSTS OFF) " + statement, parameters
                ).fetchall()
                plan = [str(row[0]).strip() for row in rows]
            connection.rollback()
        return plan


def planned_runs(migrated_url: str, dialect: str, *, analyze_sqlite: bool) -> Iterator[Planned]:
    """A recording projection on 3,000 runs, analyzed on PostgreSQL (and on SQLite
    when *analyze_sqlite*: Planned.plans_of analyzes it itself, after a first plan)."""
    by_dialect: dict[str, dict[str, Any]] = {
        "sqlite": {"factory": _RecordingSQLiteConnection},
        "postgresql": {"cursor_factory": _RecordingPostgresCursor},
        "mysql": {"cursorclass": _RecordingMySQLCursor},
    }
    recording = by_dialect[dialect]
    engine = create_engine(migrated_url, connect_args=recording)
    with engine.begin() as connection:
        connection.execute(runs.insert(), _run_rows())
        if dialect == "postgresql":
            # This schema's table only: a database-wide ANALYZE would lock every
            # table of every other test's schema (out of shared memory).
            connection.exec_driver_sql("ANALYZE relay_runs")
        elif dialect == "mysql":
            connection.exec_driver_sql("ANALYZE TABLE relay_runs")
        elif analyze_sqlite:
            connection.exec_driver_sql("ANALYZE")
    yield Planned(RunProjection(engine), engine, dialect)
    engine.dispose()


@pytest.fixture
def planned(migrated_url: str, dialect: str) -> Iterator[Planned]:
    yield from planned_runs(migrated_url, dialect, analyze_sqlite=False)
    SENT.clear()


def _anchor(planned: Planned) -> Any:
    return planned.projection.get_run("r01000")


def _assert_uses(plans: list[list[str]], index: str, dialect: str, *, ordered: bool) -> None:
    for plan in plans:
        _assert_plan_uses(plan, index, dialect, ordered=ordered)


# MariaDB has no partial indexes: an existence check or a whole listing of one
# workflow's (repo's) active runs reads the (workflow, state) index, a range of
# exactly the active runs.
ON_MYSQL = {
    "relay_runs_active_workflow": "relay_runs_workflow_state",
    "relay_runs_active_repo": "relay_runs_repo_state",
}


def _assert_plan_uses(plan: list[str], index: str, dialect: str, *, ordered: bool) -> None:
    text = "\n".join(plan)
    if dialect == "mysql" and not ordered:
        index = ON_MYSQL.get(index, index)
    assert index in text, f"expected {index} in the plan:\n{text}"
    if dialect == "sqlite":
        assert "TEMP B-TREE" not in text, f"a sort in the plan:\n{text}"
        scans = [line for line in plan if line.startswith("SCAN relay_runs")]
        assert scans == [], f"a table scan in the plan:\n{text}"
    elif dialect == "mysql":
        assert not any(" ALL " in line for line in plan), f"a table scan in the plan:\n{text}"
        assert not ordered or "filesort" not in text, f"a sort in the plan:\n{text}"
    elif ordered:
        assert not any(line.startswith("Sort") for line in plan), f"a sort in the plan:\n{text}"


ACTIVE_DEPLOYS = RunFilter(workflow="wf-0", active=True)


def test_active_runs_of_a_workflow_walk_the_partial_index(planned: Planned) -> None:
    plan = planned.plans(lambda p: p.list_runs(ACTIVE_DEPLOYS))
    # PostgreSQL may sort a handful of bitmap-fetched rows; SQLite must not.
    _assert_uses(plan, "relay_runs_active_workflow", planned.dialect, ordered=False)
    listed = planned.projection.list_runs(ACTIVE_DEPLOYS)
    assert len(listed) == RUNS // 40  # every active run is in wf-0 (index % 40 == 0)
    assert [run.id for run in listed] == sorted(run.id for run in listed)


def test_keyset_page_of_active_runs_uses_the_partial_index(planned: Planned) -> None:
    anchor = _anchor(planned)
    plan = planned.plans(lambda p: p.list_runs(ACTIVE_DEPLOYS, limit=5, after=anchor))
    _assert_uses(plan, "relay_runs_active_workflow", planned.dialect, ordered=True)


def test_keyset_page_over_everything_uses_the_list_order_index(planned: Planned) -> None:
    anchor = _anchor(planned)
    plan = planned.plans(lambda p: p.list_runs(limit=10, after=anchor))
    _assert_uses(plan, "relay_runs_list_order", planned.dialect, ordered=True)


def test_iter_runs_pages_use_the_list_order_index(planned: Planned) -> None:
    SENT.clear()
    iterator = planned.projection.iter_runs(batch_size=100)
    for _ in range(101):  # the 101st run comes from the second, keyset page
        next(iterator)
    selects = [
        (statement, parameters)
        for statement, parameters in SENT
        if statement.lstrip().upper().startswith("SELECT") and "FROM relay_runs" in statement
    ]
    assert len(selects) == 2
    plan = planned.plans_of(*selects[1])
    _assert_uses(plan, "relay_runs_list_order", planned.dialect, ordered=True)


def test_has_active_workflow_uses_its_partial_index(planned: Planned) -> None:
    plan = planned.plans(lambda p: p.has_active_workflow("wf-1"))
    _assert_uses(plan, "relay_runs_active_workflow", planned.dialect, ordered=False)
    # Every active run is in wf-0 (index % 40 == 0 implies index % 5 == 0).
    assert planned.projection.has_active_workflow("wf-0") is True
    assert planned.projection.has_active_workflow("wf-1") is False


def test_has_active_repo_uses_its_partial_index(planned: Planned) -> None:
    plan = planned.plans(lambda p: p.has_active_repo("repo-1"))
    _assert_uses(plan, "relay_runs_active_repo", planned.dialect, ordered=False)
    assert planned.projection.has_active_repo("repo-1") is True
    assert planned.projection.has_active_repo("repo-9") is False


def test_count_sweepable_uses_the_sweepable_index(planned: Planned) -> None:
    # A cutoff that keeps most runs: MariaDB rightly scans a table half of whose
    # rows match (no partial index there), and so would any planner.
    cutoff = T0 + timedelta(hours=2)
    plan = planned.plans(lambda p: p.count_sweepable(cutoff))
    _assert_uses(plan, "relay_runs_sweepable", planned.dialect, ordered=False)
    expected = sum(1 for index in range(2 * 60) if index % 40)  # finished before the cutoff
    assert planned.projection.count_sweepable(cutoff) == expected


def test_sweep_selects_its_batches_from_the_sweepable_index(planned: Planned) -> None:
    cutoff = T0 + timedelta(hours=1)
    plan = planned.plans(lambda p: p.sweep_retention(cutoff, batch_size=10))
    _assert_uses(plan, "relay_runs_sweepable", planned.dialect, ordered=True)


def test_sweep_deletes_find_their_rows_by_key(planned: Planned) -> None:
    """A batch's DELETEs search each table by key for the batch's ids, bound as one
    value (a JSON array read by json_each on SQLite, an array on PostgreSQL)."""
    SENT.clear()
    swept = planned.projection.sweep_retention(T0 + timedelta(hours=1), batch_size=10)
    assert swept
    deletes = [(s, p) for s, p in SENT if s.lstrip().upper().startswith("DELETE")]
    tables = [statement.split()[2] for statement, _ in deletes]
    per_batch = (
        ["relay_runs"]
        if planned.dialect != "sqlite"  # the cascade deletes the child rows
        else ["relay_processed_reports", "relay_node_sessions", "relay_node_runtime", "relay_runs"]
    )
    assert tables[: len(per_batch)] == per_batch
    for (statement, parameters), table in zip(deletes, tables, strict=True):
        text = "\n".join(planned._plan(statement, parameters))
        if planned.dialect == "mysql":  # a literal IN list (PyMySQL interpolates)
            assert f"{table} range key=PRIMARY" in text, text
            continue
        assert len(parameters if planned.dialect == "sqlite" else parameters.values()) == 1
        if planned.dialect == "sqlite":
            assert f"SEARCH {table} USING" in text, text
            assert f"SCAN {table}" not in text, text
        else:
            assert f"Index Scan using pk_{table}" in text, text
            assert "Seq Scan" not in text, text
