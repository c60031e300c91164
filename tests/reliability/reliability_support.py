"""Shared helpers of the reliability suite: the size knob, invariants, snapshots.

Size knob: ``RELAY_RELIABILITY_SCALE`` (default ``1``, what CI runs: the whole
``tests/reliability/`` finishes in a few minutes on a 2-core machine). Every
scenario multiplies its operation counts, kill counts and Hypothesis examples
by it, so ``RELAY_RELIABILITY_SCALE=20 pytest tests/reliability -rA`` is a
long local soak. Each scenario prints its figures (operations, errors, p99
latency, kills survived, examples tried); ``-rA`` (or ``-s``) shows them.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

SCALE_VARIABLE = "RELAY_RELIABILITY_SCALE"
PROJECTION_TABLES = (
    "relay_executor_identity",
    "relay_runs",
    "relay_node_runtime",
    "relay_processed_reports",
    "relay_node_sessions",
)
AUDIT_TABLE = "reliability_runtime_audit"
# Children start fresh interpreters: no inherited engines, locks or threads.
SPAWN = multiprocessing.get_context("spawn")


def scale() -> float:
    """The size multiplier from ``$RELAY_RELIABILITY_SCALE`` (default 1)."""
    raw = os.environ.get(SCALE_VARIABLE, "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_VARIABLE} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{SCALE_VARIABLE} must be positive, got {raw!r}")
    return value


def scaled(base: int, minimum: int = 1) -> int:
    """*base* times the size knob, never below *minimum*."""
    return max(minimum, math.ceil(base * scale()))


def percentile(values: Iterable[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of *values*; 0.0 when empty."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


# Primary keys, the sort order of snapshots (no reflection: snapshots are taken often).
TABLE_KEYS = {
    "relay_executor_identity": "singleton",
    "relay_runs": "id",
    "relay_node_runtime": "run_id, node",
    "relay_processed_reports": "run_id, report_id",
    "relay_node_sessions": "run_id, node, session_id",
    "alembic_version": "version_num",
}


def snapshot(engine: Engine, tables: Iterable[str] = PROJECTION_TABLES) -> dict[str, Any]:
    """Every row of *tables* plus the Alembic version row: for "nothing changed" checks."""
    with engine.connect() as connection:
        names = set(sa.inspect(connection).get_table_names())
        state: dict[str, Any] = {"tables": sorted(names)}
        for name in (*tables, "alembic_version"):
            if name in names:
                rows = connection.exec_driver_sql(
                    f"SELECT * FROM {name} ORDER BY {TABLE_KEYS[name]}"  # fixed names only
                )
                state[name] = [tuple(row) for row in rows]
        return state


def invariant_violations(connection: Connection) -> list[str]:
    """What a committed projection must always satisfy, whatever was interrupted.

    - a run's current node and visit are set together, and the runtime row of
      its current node carries the same visit (update_node is one transaction);
    - every bound session was registered for that node (relay_node_sessions);
    - no child row outlives its run (sweeps and cascades are atomic).
    """
    problems: list[str] = []
    runs = {
        row[0]: (row[1], row[2])
        for row in connection.exec_driver_sql(
            "SELECT id, current_node, current_node_visit_id FROM relay_runs"
        )
    }
    runtimes = {
        (row[0], row[1]): (row[2], row[3])
        for row in connection.exec_driver_sql(
            "SELECT run_id, node, node_visit_id, session_id FROM relay_node_runtime"
        )
    }
    sessions = {
        (row[0], row[1], row[2]): row[3]
        for row in connection.exec_driver_sql(
            "SELECT run_id, node, session_id, node_visit_id FROM relay_node_sessions"
        )
    }
    for run_id, (node, visit) in sorted(runs.items()):
        if (node is None) != (visit is None):
            problems.append(f"run {run_id!r}: current node {node!r} but visit {visit!r}")
        if node is None:
            continue
        runtime = runtimes.get((run_id, node))
        if runtime is None:
            problems.append(f"run {run_id!r}: current node {node!r} has no runtime row")
        elif runtime[0] != visit:
            problems.append(
                f"run {run_id!r}: current visit {visit!r} but node {node!r} runtime visit "
                f"{runtime[0]!r} (update_node half-applied)"
            )
    for (run_id, node), (_visit, session) in sorted(runtimes.items()):
        if session is not None and (run_id, node, session) not in sessions:
            problems.append(f"run {run_id!r} node {node!r}: bound session {session!r} unregistered")
    for table in ("relay_node_runtime", "relay_processed_reports", "relay_node_sessions"):
        statement = sa.text(f"SELECT DISTINCT run_id FROM {table}")  # table: fixed names above
        for (run_id,) in connection.execute(statement):
            if run_id not in runs:
                problems.append(f"{table}: rows of run {run_id!r}, which does not exist")
    return problems


_SQLITE_AUDIT = (
    f"""CREATE TABLE {AUDIT_TABLE} (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT, node TEXT, old_session TEXT, new_session TEXT,
        old_visit TEXT, new_visit TEXT)""",
    f"""CREATE TRIGGER {AUDIT_TABLE}_insert AFTER INSERT ON relay_node_runtime
    BEGIN
        INSERT INTO {AUDIT_TABLE} (run_id, node, old_session, new_session, old_visit, new_visit)
        VALUES (NEW.run_id, NEW.node, NULL, NEW.session_id, NULL, NEW.node_visit_id);
    END""",
    f"""CREATE TRIGGER {AUDIT_TABLE}_update AFTER UPDATE ON relay_node_runtime
    BEGIN
        INSERT INTO {AUDIT_TABLE} (run_id, node, old_session, new_session, old_visit, new_visit)
        VALUES (NEW.run_id, NEW.node, OLD.session_id, NEW.session_id,
                OLD.node_visit_id, NEW.node_visit_id);
    END""",
)
_POSTGRESQL_AUDIT = (
    f"""CREATE TABLE {AUDIT_TABLE} (
        seq BIGSERIAL PRIMARY KEY,
        run_id TEXT, node TEXT, old_session TEXT, new_session TEXT,
        old_visit TEXT, new_visit TEXT)""",
    f"""CREATE FUNCTION {AUDIT_TABLE}_record() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO {AUDIT_TABLE} (run_id, node, old_session, new_session, old_visit, new_visit)
            VALUES (NEW.run_id, NEW.node, NULL, NEW.session_id, NULL, NEW.node_visit_id);
        ELSE
            INSERT INTO {AUDIT_TABLE} (run_id, node, old_session, new_session, old_visit, new_visit)
            VALUES (NEW.run_id, NEW.node, OLD.session_id, NEW.session_id,
                    OLD.node_visit_id, NEW.node_visit_id);
        END IF;
        RETURN NEW;
    END $$""",
    f"""CREATE TRIGGER {AUDIT_TABLE}_trigger AFTER INSERT OR UPDATE ON relay_node_runtime
    FOR EACH ROW EXECUTE FUNCTION {AUDIT_TABLE}_record()""",
)


_MYSQL_AUDIT = (
    f"""CREATE TABLE {AUDIT_TABLE} (
        seq BIGINT AUTO_INCREMENT PRIMARY KEY,
        run_id VARBINARY(512), node VARBINARY(512), old_session VARBINARY(512),
        new_session VARBINARY(512), old_visit VARBINARY(512), new_visit VARBINARY(512)
    ) ENGINE=InnoDB""",
    f"""CREATE TRIGGER {AUDIT_TABLE}_insert AFTER INSERT ON relay_node_runtime FOR EACH ROW
        INSERT INTO {AUDIT_TABLE} (run_id, node, old_session, new_session, old_visit, new_visit)
        VALUES (NEW.run_id, NEW.node, NULL, NEW.session_id, NULL, NEW.node_visit_id)""",
    f"""CREATE TRIGGER {AUDIT_TABLE}_update AFTER UPDATE ON relay_node_runtime FOR EACH ROW
        INSERT INTO {AUDIT_TABLE} (run_id, node, old_session, new_session, old_visit, new_visit)
        VALUES (NEW.run_id, NEW.node, OLD.session_id, NEW.session_id,
                OLD.node_visit_id, NEW.node_visit_id)""",
)


def install_runtime_audit(engine: Engine) -> None:
    """Log every change of relay_node_runtime, in the writer's own transaction.

    A test-only trigger: it sees each binding at the instant it is written, so
    "a session is bound only under the visit it was registered for" can be
    checked for every bind, not just for the final state.
    """
    statements = {"postgresql": _POSTGRESQL_AUDIT, "mysql": _MYSQL_AUDIT}.get(
        engine.dialect.name, _SQLITE_AUDIT
    )
    with engine.begin() as connection:
        for statement in statements:
            connection.exec_driver_sql(statement)


def audit_violations(connection: Connection) -> tuple[int, int, list[str]]:
    """Check every logged runtime change; returns (changes, binds, problems).

    - a bind (session set or changed) happens only under the visit the session
      was first registered for: the session's visit equals the runtime's visit
      in the very transaction that bound it;
    - moving a node to a new visit keeps its bound session (update_node).
    """
    sessions = {
        (row[0], row[1], row[2]): row[3]
        for row in connection.exec_driver_sql(
            "SELECT run_id, node, session_id, node_visit_id FROM relay_node_sessions"
        )
    }
    changes = binds = 0
    problems: list[str] = []
    rows = connection.exec_driver_sql(
        f"SELECT seq, run_id, node, old_session, new_session, old_visit, new_visit "
        f"FROM {AUDIT_TABLE} ORDER BY seq"
    )
    for seq, run_id, node, old_session, new_session, old_visit, new_visit in rows:
        changes += 1
        if new_session is not None and new_session != old_session:
            binds += 1
            registered = sessions.get((run_id, node, new_session))
            if registered != new_visit:
                problems.append(
                    f"change {seq}: session {new_session!r} bound to {run_id}/{node} under visit "
                    f"{new_visit!r}, but it was registered under {registered!r}"
                )
        if old_visit is not None and new_visit != old_visit and new_session != old_session:
            problems.append(
                f"change {seq}: moving {run_id}/{node} to visit {new_visit!r} changed its "
                f"session {old_session!r} -> {new_session!r}"
            )
    return changes, binds, problems
