"""Generation 2: node runtime bindings, report receipts, session bindings, retries.

Revision ID: 0002_generation_2
Revises: 0001_generation_1
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relay_flow_projection.migrations.frozen_v1 import (
    create_table,
    free_text,
    identifier,
    utc_timestamp,
)
from relay_flow_projection.migrations.frozen_v2 import add_column

revision: str = "0002_generation_2"
down_revision: str | Sequence[str] | None = "0001_generation_1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# downgrade() drops tables and columns: the CLI's `downgrade` asks for --yes (README).
downgrade_keeps_data: bool = False

RETRY_COLUMNS = ("retry_error", "retry_attempt", "next_retry_at")


def _run_id() -> sa.Column[str]:
    return sa.Column("run_id", identifier(), nullable=False)


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["relay_runs.id"], name=f"fk_{table}_run_id_relay_runs", ondelete="CASCADE"
    )


def upgrade() -> None:
    add_column("relay_runs", sa.Column("retry_error", free_text(), nullable=True))
    add_column("relay_runs", sa.Column("retry_attempt", sa.Integer(), nullable=True))
    add_column("relay_runs", sa.Column("next_retry_at", utc_timestamp(), nullable=True))
    create_table(
        "relay_node_runtime",
        _run_id(),
        sa.Column("node", identifier(), nullable=False),
        sa.Column("terminal_id", free_text(), nullable=True),
        sa.Column("session_id", identifier(), nullable=True),
        sa.Column("node_visit_id", identifier(), nullable=False),
        sa.Column("updated_at", utc_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "node", name="pk_relay_node_runtime"),
        _run_fk("relay_node_runtime"),
    )
    create_table(
        "relay_processed_reports",
        _run_id(),
        sa.Column("report_id", identifier(), nullable=False),
        sa.Column("node_visit_id", identifier(), nullable=False),
        sa.Column("created_at", utc_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "report_id", name="pk_relay_processed_reports"),
        _run_fk("relay_processed_reports"),
    )
    create_table(
        "relay_node_sessions",
        _run_id(),
        sa.Column("node", identifier(), nullable=False),
        sa.Column("session_id", identifier(), nullable=False),
        sa.Column("node_visit_id", identifier(), nullable=False),
        sa.Column("created_at", utc_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "node", "session_id", name="pk_relay_node_sessions"),
        _run_fk("relay_node_sessions"),
    )


def downgrade() -> None:
    op.drop_table("relay_node_sessions")
    op.drop_table("relay_processed_reports")
    op.drop_table("relay_node_runtime")
    with op.batch_alter_table("relay_runs") as batch:
        for column in reversed(RETRY_COLUMNS):
            batch.drop_column(column)
