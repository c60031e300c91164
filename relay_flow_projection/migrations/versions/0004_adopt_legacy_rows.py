"""Repair rows written by the Go releases; replaces their ad-hoc backfill.

- Child rows whose run is gone are deleted (the Go driver never enabled
  foreign keys, so they exist), and the count removed is logged.
- logical_run_id = id where it is NULL or '', attempt_id = 1 where NULL or 0
  (the Go code's startup backfill).
- '' in optional text columns becomes NULL, as every write now stores it.
- SQLite only: timestamps written by Go's driver (nanoseconds, trimmed
  fractions, any offset) are rewritten in the canonical fixed-width UTC text,
  so that text order is time order again.
- SQLite only: relay_runs as the Go DDL created it (``id TEXT PRIMARY KEY``,
  which SQLite lets hold NULL) is replaced by a copy with the NOT NULL key the
  chain declares, so an adopted database matches the models (`alembic check`).
  The copy applies the repairs above as it goes, so it costs no extra pass;
  tables this chain created are updated in place instead.

The Go releases wrote SQLite files only: on PostgreSQL and MySQL/MariaDB the
repairs find nothing to change in a database this chain made, and run anyway,
so that every backend takes the same steps.

Rows are copied or updated in batches of run ids, each batch its own statement
in autocommit: WAL size and memory stay flat however many runs there are.
Every step is idempotent, so an interrupted upgrade is simply run again; the
copy replaces relay_runs, and the version row moves, in one final transaction.
Adopting a Go file (SQLite) expects no relay-flow worker writing meanwhile (the
Go release being replaced is stopped).

On PostgreSQL and MySQL this revision runs while the previous release keeps
writing (a rolling deploy). Since 0.5.0 it takes batches of 1,000 runs there,
and updates only the rows that need a repair (none, in a database this chain
made): a writer waits for one short batch at most, and no row is rewritten
for nothing. The result is the same as 0.4.0's (tests/test_live_upgrades.py).

Revision ID: 0004_adopt_legacy_rows
Revises: 0003_generation_3
Create Date: 2026-12-02
"""

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

from relay_flow_projection.migrations.frozen_v1 import (
    MigrationRefused,
    normalize_stored_text,
    utc_timestamp,
)

revision: str = "0004_adopt_legacy_rows"
down_revision: str | Sequence[str] | None = "0003_generation_3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# downgrade() changes nothing: no --yes needed (README).
downgrade_keeps_data: bool = True

log = logging.getLogger("relay_flow_projection.migrations")

# Runs per batch. SQLite (one writer at a time anyway): large batches, fewest
# statements. The servers: batches short enough that a writer queued behind
# one waits milliseconds.
BATCH_SIZE = {"sqlite": 50_000}
SERVER_BATCH_SIZE = 1_000
NORMALIZE_FUNCTION = "relay_normalize_timestamp"

runs = sa.table(
    "relay_runs",
    *(
        sa.column(name)
        for name in (
            "id",
            "logical_run_id",
            "attempt_id",
            "current_node",
            "current_node_visit_id",
            "last_error",
            "next_retry_at",
            "started_at",
            "updated_at",
            "finished_at",
        )
    ),
)
node_runtime = sa.table(
    "relay_node_runtime",
    *(sa.column(name) for name in ("run_id", "terminal_id", "session_id", "updated_at")),
)
processed_reports = sa.table(
    "relay_processed_reports", sa.column("run_id"), sa.column("created_at")
)
node_sessions = sa.table("relay_node_sessions", sa.column("run_id"), sa.column("created_at"))
CHILDREN = (node_runtime, processed_reports, node_sessions)

OPTIONAL_TEXT = {
    "relay_runs": ("current_node", "current_node_visit_id", "last_error"),
    "relay_node_runtime": ("terminal_id", "session_id"),
}
TIMESTAMPS = {
    "relay_runs": ("next_retry_at", "started_at", "updated_at", "finished_at"),
    "relay_node_runtime": ("updated_at",),
    "relay_processed_reports": ("created_at",),
    "relay_node_sessions": ("created_at",),
}


def _repairs(table: sa.TableClause, normalize_timestamps: bool) -> dict[str, Any]:
    values: dict[str, Any] = {
        name: sa.func.nullif(table.c[name], "") for name in OPTIONAL_TEXT.get(table.name, ())
    }
    if table.name == "relay_runs":
        values["logical_run_id"] = sa.case(
            (sa.func.coalesce(table.c.logical_run_id, "") == "", table.c.id),
            else_=table.c.logical_run_id,
        )
        values["attempt_id"] = sa.case(
            (sa.or_(table.c.attempt_id.is_(None), table.c.attempt_id == 0), 1),
            else_=table.c.attempt_id,
        )
    if normalize_timestamps:
        for name in TIMESTAMPS[table.name]:
            values[name] = getattr(sa.func, NORMALIZE_FUNCTION)(table.c[name])
    return values


def _needing_repair(table: sa.TableClause) -> Any:
    """The rows _repairs(table, False) changes: the servers update only those."""
    needs = [table.c[name] == "" for name in OPTIONAL_TEXT.get(table.name, ())]
    if table.name == "relay_runs":
        needs += [
            table.c.logical_run_id.is_(None),
            table.c.logical_run_id == "",
            table.c.attempt_id.is_(None),
            table.c.attempt_id == 0,
        ]
    return sa.or_(*needs)


def _delete_orphans(
    bind: sa.Connection, low: str | None, high: str | None, removed: Counter[str]
) -> None:
    for child in CHILDREN:
        orphaned = ~sa.exists().where(runs.c.id == child.c.run_id)
        in_batch = _in_range(child.c.run_id, low, high)
        removed[child.name] += bind.execute(sa.delete(child).where(in_batch, orphaned)).rowcount


def _batch_bounds(bind: sa.Connection) -> list[tuple[str | None, str | None]]:
    """Half-open id ranges (lo, hi] of at most the dialect's batch size each, in id order."""
    size = BATCH_SIZE.get(bind.dialect.name, SERVER_BATCH_SIZE)
    bounds: list[tuple[str | None, str | None]] = []
    low: str | None = None
    while True:
        query = sa.select(runs.c.id).order_by(runs.c.id).offset(size - 1).limit(1)
        if low is not None:
            query = query.where(runs.c.id > low)
        high = bind.execute(query).scalar_one_or_none()
        bounds.append((low, high))
        if high is None:
            return bounds
        low = high


def _in_range(column: sa.ColumnClause[Any], low: str | None, high: str | None) -> Any:
    conditions = []
    if low is not None:
        conditions.append(column > low)
    if high is not None:
        conditions.append(column <= high)
    return sa.and_(sa.true(), *conditions)


RUN_COPY = "relay_runs_adopting"
LEGACY_RUN_INDEXES = {
    "relay_runs_ticket_key": ["ticket_key"],
    "relay_runs_workflow_state": ["workflow", "state"],
    "relay_runs_repo_state": ["repo", "state"],
}


def _run_columns(metadata: sa.MetaData, name: str) -> sa.Table:
    """relay_runs with every column of 0003, as this chain creates it (NOT NULL id)."""
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("logical_run_id", sa.Text()),
        sa.Column("attempt_id", sa.Integer()),
        sa.Column("repo", sa.Text(), nullable=False),
        sa.Column("workflow", sa.Text(), nullable=False),
        sa.Column("ticket_id", sa.Text(), nullable=False),
        sa.Column("ticket_key", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("current_node", sa.Text()),
        sa.Column("current_node_visit_id", sa.Text()),
        sa.Column("last_error", sa.Text()),
        sa.Column("retry_error", sa.Text()),
        sa.Column("retry_attempt", sa.Integer()),
        sa.Column("next_retry_at", utc_timestamp()),
        sa.Column("started_at", utc_timestamp(), nullable=False),
        sa.Column("updated_at", utc_timestamp(), nullable=False),
        sa.Column("finished_at", utc_timestamp()),
        sa.PrimaryKeyConstraint("id", name="pk_relay_runs"),
    )


def _key_is_nullable(bind: sa.Connection, table: str, column: str) -> bool:
    return any(c["nullable"] for c in sa.inspect(bind).get_columns(table) if c["name"] == column)


def _require_foreign_keys_off(bind: sa.Connection) -> None:
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # A caller-provided connection with foreign keys on: dropping the old
        # relay_runs would cascade-delete every child row. Refuse instead.
        raise MigrationRefused(
            "adopting this database replaces relay_runs, which needs SQLite foreign keys "
            "off: run the upgrade through relay_flow_projection.upgrade() or `alembic upgrade`"
        )


def _start_run_copy(bind: sa.Connection) -> tuple[sa.Table, sa.Table]:
    """An empty copy of relay_runs to fill (a leftover of an interrupted run is dropped)."""
    metadata = sa.MetaData()
    source = _run_columns(metadata, "relay_runs")
    copy = _run_columns(metadata, RUN_COPY)
    copy.drop(bind, checkfirst=True)
    copy.create(bind)
    missing = bind.execute(
        sa.select(sa.func.count()).select_from(source).where(source.c.id.is_(None))
    ).scalar_one()
    if missing:
        log.warning("skipped %d relay_runs rows without an id: nothing can refer to them", missing)
    return source, copy


def _copy_runs(
    bind: sa.Connection, source: sa.Table, copy: sa.Table, low: str | None, high: str | None
) -> None:
    repairs = _repairs(source, normalize_timestamps=True)
    selected = [repairs.get(column.name, column) for column in source.columns]
    rows = sa.select(*selected).where(source.c.id.is_not(None), _in_range(source.c.id, low, high))
    bind.execute(sa.insert(copy).from_select([c.name for c in copy.columns], rows))


def _index_run_copy(copy: sa.Table) -> None:
    """Move the Go indexes onto the copy (the old table's go first: names are per schema)."""
    for name, columns in LEGACY_RUN_INDEXES.items():
        op.drop_index(name, table_name="relay_runs", if_exists=True)
        op.create_index(name, copy.name, columns)


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    if context.is_offline_mode():
        # No reads in a printed script: one statement per table.
        with op.get_context().autocommit_block():
            for table in (runs, *CHILDREN):
                values = _repairs(table, False)
                if values:  # an UPDATE without SET is not SQL (it was printed until 2026-12)
                    update = sa.update(table).values(values)
                    op.execute(update if sqlite else update.where(_needing_repair(table)))
        return
    if sqlite:
        bind.connection.driver_connection.create_function(  # type: ignore[union-attr]
            NORMALIZE_FUNCTION, 1, normalize_stored_text, deterministic=True
        )
    replace_runs = sqlite and _key_is_nullable(bind, "relay_runs", "id")
    rebuild_identity = sqlite and _key_is_nullable(bind, "relay_executor_identity", "singleton")
    if replace_runs or rebuild_identity:
        _require_foreign_keys_off(bind)
    with op.get_context().autocommit_block():
        if replace_runs:
            source, copy = _start_run_copy(bind)
        in_place = CHILDREN if replace_runs else (runs, *CHILDREN)
        orphans: Counter[str] = Counter()
        for low, high in _batch_bounds(bind):
            _delete_orphans(bind, low, high, orphans)
            if replace_runs:
                _copy_runs(bind, source, copy, low, high)
            for table in in_place:
                key = table.c.id if table is runs else table.c.run_id
                values = _repairs(table, sqlite)
                if values:
                    update = sa.update(table).where(_in_range(key, low, high)).values(values)
                    bind.execute(update if sqlite else update.where(_needing_repair(table)))
        for name, count in sorted(orphans.items()):
            if count:
                log.warning("removed %d orphaned rows from %s", count, name)
        if replace_runs:
            _index_run_copy(copy)
    # The swap and the version row commit together.
    if replace_runs:
        # Builds with SQLITE_SECURE_DELETE (Debian's) would zero every page of
        # the old table through the WAL (1M runs: +170 MiB); its rows live on
        # in the copy, so "fast" (no extra I/O) loses nothing.
        secure_delete = bind.exec_driver_sql("PRAGMA secure_delete").scalar()
        bind.exec_driver_sql("PRAGMA secure_delete = FAST")
        op.drop_table("relay_runs")
        bind.exec_driver_sql(f"PRAGMA secure_delete = {int(secure_delete or 0)}")
        op.rename_table(RUN_COPY, "relay_runs")
    if rebuild_identity:
        # From 0003's definition: a rebuild by reflection would lose the CHECK.
        with op.batch_alter_table(
            "relay_executor_identity", copy_from=_identity_table(), recreate="always"
        ):
            pass


def _identity_table() -> sa.Table:
    """relay_executor_identity exactly as 0003_generation_3 creates it."""
    return sa.Table(
        "relay_executor_identity",
        sa.MetaData(),
        sa.Column("singleton", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("executor_plugin", sa.Text(), nullable=False),
        sa.Column("temporal_address", sa.Text(), nullable=True),
        sa.Column("temporal_namespace", sa.Text(), nullable=True),
        sa.CheckConstraint("singleton = 1", name="ck_relay_executor_identity_singleton"),
        sa.PrimaryKeyConstraint("singleton", name="pk_relay_executor_identity"),
    )


def downgrade() -> None:
    # The repaired rows are valid under every earlier revision; nothing to undo.
    pass
