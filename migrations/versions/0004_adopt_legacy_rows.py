"""Repair rows written by the Go releases; replaces their ad-hoc backfill.

- Child rows whose run is gone are deleted (the Go driver never enabled
  foreign keys, so they exist), and the count removed is logged.
- logical_run_id = id where it is NULL or '', attempt_id = 1 where NULL or 0
  (the Go code's startup backfill).
- '' in optional text columns becomes NULL, as every write now stores it.
- SQLite only: timestamps written by Go's driver (nanoseconds, trimmed
  fractions, any offset) are rewritten in the canonical fixed-width UTC text,
  so that text order is time order again.
- SQLite only: tables created by the Go DDL are rebuilt with the NOT NULL keys
  the chain declares (``id TEXT PRIMARY KEY`` accepts NULL in SQLite), so an
  adopted database matches the models (`alembic check`). This one copy of
  relay_runs is a single transaction; tables this chain created are skipped.

The rows are updated in batches of run ids, each batch its own statement in
autocommit: WAL size and memory stay flat however many runs there are. Every
step is idempotent, so an interrupted upgrade is simply run again (the
version row moves only after the last batch).

Revision ID: 0004_adopt_legacy_rows
Revises: 0003_generation_3
Create Date: 2026-12-02
"""

import logging
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

from relay_flow_projection.errors import ProjectionError
from relay_flow_projection.timestamps import normalize_stored_text

revision: str = "0004_adopt_legacy_rows"
down_revision: str | Sequence[str] | None = "0003_generation_3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("relay_flow_projection.migrations")

BATCH_SIZE = 50_000
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


def _delete_orphans(bind: sa.Connection) -> None:
    for child in CHILDREN:
        orphaned = ~sa.exists().where(runs.c.id == child.c.run_id)
        result = bind.execute(sa.delete(child).where(orphaned))
        if result.rowcount:
            log.warning("removed %d orphaned rows from %s", result.rowcount, child.name)


def _batch_bounds(bind: sa.Connection) -> list[tuple[str | None, str | None]]:
    """Half-open id ranges (lo, hi] of at most BATCH_SIZE runs each, in id order."""
    bounds: list[tuple[str | None, str | None]] = []
    low: str | None = None
    while True:
        query = sa.select(runs.c.id).order_by(runs.c.id).offset(BATCH_SIZE - 1).limit(1)
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


def upgrade() -> None:
    bind = op.get_bind()
    offline = context.is_offline_mode()
    normalize = bind.dialect.name == "sqlite" and not offline
    if normalize:
        bind.connection.driver_connection.create_function(  # type: ignore[union-attr]
            NORMALIZE_FUNCTION, 1, normalize_stored_text, deterministic=True
        )
    with op.get_context().autocommit_block():
        if offline:
            # No reads in a printed script: one statement per table.
            for table in (runs, *CHILDREN):
                op.execute(sa.update(table).values(_repairs(table, False)))
            return
        _delete_orphans(bind)
        for low, high in _batch_bounds(bind):
            for table in (runs, *CHILDREN):
                key = table.c.id if table is runs else table.c.run_id
                values = _repairs(table, normalize)
                if values:
                    bind.execute(sa.update(table).where(_in_range(key, low, high)).values(values))
    _require_not_null_keys(bind)


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


def _require_not_null_keys(bind: sa.Connection) -> None:
    """SQLite: rebuild Go-created tables whose primary key reflects as nullable.

    Runs with foreign keys off (migration_env), so dropping the old relay_runs
    cascades nothing. The identity table is rebuilt from 0003's definition: a
    rebuild from reflection would drop its unnamed CHECK constraint.
    """
    if bind.dialect.name != "sqlite":
        return
    inspector = sa.inspect(bind)
    runs_id_nullable = any(
        c["nullable"] for c in inspector.get_columns("relay_runs") if c["name"] == "id"
    )
    singleton_nullable = any(
        c["nullable"]
        for c in inspector.get_columns("relay_executor_identity")
        if c["name"] == "singleton"
    )
    if not (runs_id_nullable or singleton_nullable):
        return  # tables created by this chain
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # A caller-provided connection with foreign keys on: dropping the old
        # relay_runs would cascade-delete every child row. Refuse instead.
        raise ProjectionError(
            "adopting this database rebuilds relay_runs, which needs SQLite foreign keys "
            "off: run the upgrade through relay_flow_projection.upgrade() or `alembic upgrade`"
        )
    if runs_id_nullable:
        with op.batch_alter_table("relay_runs") as batch:
            batch.alter_column("id", existing_type=sa.Text(), nullable=False)
    if singleton_nullable:
        with op.batch_alter_table(
            "relay_executor_identity", copy_from=_identity_table(), recreate="always"
        ):
            pass


def downgrade() -> None:
    # The repaired rows are valid under every earlier revision; nothing to undo.
    pass
