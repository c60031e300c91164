"""The five projection tables as SQLAlchemy Core objects.

Column names, types, keys and the ``ON DELETE CASCADE`` foreign keys are those
of relay-flow 0.2.5 (``projection.go``), so databases written by the Go
releases can be adopted in place. Text columns are identifiers or free text
(column_types.py), which differ on MySQL/MariaDB only. The Alembic chain in ``migrations/`` builds
exactly this; ``alembic check`` proves it in CI.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    ColumnElement,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    bindparam,
)

from .column_types import free_text, identifier
from .models import TERMINAL_STATES
from .timestamps import UtcDateTime

# Named constraints keep SQLite batch migrations and autogenerate diffs stable.
# The index pattern reproduces the names the Go releases gave their indexes
# (relay_runs_ticket_key, ...), so adopted databases need no renames.
NAMING_CONVENTION = {
    "ix": "%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# MySQL/MariaDB: InnoDB (foreign keys, transactions, row locks) and utf8mb4 for
# the free-text columns, whatever the server's or database's defaults are.
# Identifiers are binary (column_types.py), so the collation compares nothing.
MYSQL_TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}

# Terminal states are rendered as SQL literals, never as bound parameters: the
# planners only use the partial indexes below when the query's predicate is
# textually the index's predicate, and a bound parameter defeats that.
TERMINAL_STATE_VALUES: tuple[str, ...] = tuple(sorted(s.value for s in TERMINAL_STATES))


def _terminal_states() -> ColumnElement[list[str]]:
    return bindparam(
        "terminal_states", value=list(TERMINAL_STATE_VALUES), expanding=True, literal_execute=True
    )


executor_identity = Table(
    "relay_executor_identity",
    metadata,
    Column("singleton", Integer, primary_key=True, autoincrement=False),
    Column("executor_plugin", free_text(), nullable=False),
    Column("temporal_address", free_text()),
    Column("temporal_namespace", free_text()),
    CheckConstraint("singleton = 1", name="singleton"),
    **MYSQL_TABLE_OPTIONS,
)

runs = Table(
    "relay_runs",
    metadata,
    Column("id", identifier(), primary_key=True),
    # Nullable as in the Go schema: rows older than attempts carry NULL/''/0,
    # which the adoption migration backfills and the read path maps anyway.
    Column("logical_run_id", identifier()),
    Column("attempt_id", Integer),
    Column("repo", identifier(), nullable=False),
    Column("workflow", identifier(), nullable=False),
    Column("ticket_id", identifier(), nullable=False),
    Column("ticket_key", identifier(), nullable=False),
    Column("state", identifier(), nullable=False),
    Column("current_node", identifier()),
    Column("current_node_visit_id", identifier()),
    Column("last_error", free_text()),
    Column("retry_error", free_text()),
    Column("retry_attempt", Integer),
    Column("next_retry_at", UtcDateTime()),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    Column("finished_at", UtcDateTime()),
    **MYSQL_TABLE_OPTIONS,
)

is_active = runs.c.state.not_in(_terminal_states())
is_terminal = runs.c.state.in_(_terminal_states())

Index(None, runs.c.ticket_key)
Index(None, runs.c.workflow, runs.c.state)
Index(None, runs.c.repo, runs.c.state)
# Keyset paging over everything, and "latest attempt of a logical run".
Index("relay_runs_list_order", runs.c.started_at, runs.c.id)
Index("relay_runs_logical_attempts", runs.c.logical_run_id, runs.c.started_at, runs.c.attempt_id)
# Active runs of one workflow / repo in list order, without a sort.
Index(
    "relay_runs_active_workflow",
    runs.c.workflow,
    runs.c.started_at,
    runs.c.id,
    sqlite_where=is_active,
    postgresql_where=is_active,
)
Index(
    "relay_runs_active_repo",
    runs.c.repo,
    runs.c.started_at,
    runs.c.id,
    sqlite_where=is_active,
    postgresql_where=is_active,
)
# Retention sweeps find expired terminal runs without scanning the table.
Index(
    "relay_runs_sweepable",
    runs.c.finished_at,
    sqlite_where=is_terminal,
    postgresql_where=is_terminal,
)


def _run_id_column() -> Column[str]:
    return Column(
        "run_id",
        identifier(),
        ForeignKey(runs.c.id, ondelete="CASCADE"),
        nullable=False,
        primary_key=True,
    )


node_runtime = Table(
    "relay_node_runtime",
    metadata,
    _run_id_column(),
    Column("node", identifier(), primary_key=True),
    Column("terminal_id", free_text()),
    Column("session_id", identifier()),
    Column("node_visit_id", identifier(), nullable=False),
    Column("updated_at", UtcDateTime(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)

processed_reports = Table(
    "relay_processed_reports",
    metadata,
    _run_id_column(),
    Column("report_id", identifier(), primary_key=True),
    Column("node_visit_id", identifier(), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)

node_sessions = Table(
    "relay_node_sessions",
    metadata,
    _run_id_column(),
    Column("node", identifier(), primary_key=True),
    Column("session_id", identifier(), primary_key=True),
    Column("node_visit_id", identifier(), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)

# Child tables in the order a run's rows are deleted (children before parent).
RUN_CHILD_TABLES: tuple[Table, ...] = (processed_reports, node_sessions, node_runtime)
PROJECTION_TABLES: tuple[Table, ...] = (executor_identity, runs, *RUN_CHILD_TABLES)
