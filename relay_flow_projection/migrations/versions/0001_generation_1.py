"""Generation 1: relay_runs only (the oldest Go releases).

Reproduces the shape LEGACY.md calls generation 1, so an unversioned database
of that generation can be stamped here and upgraded.

Revision ID: 0001_generation_1
Revises:
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relay_flow_projection.migrations.frozen_v1 import (
    create_index,
    create_table,
    free_text,
    identifier,
    utc_timestamp,
)

revision: str = "0001_generation_1"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# downgrade() drops relay_runs: the CLI's `downgrade` asks for --yes (README).
downgrade_keeps_data: bool = False


def upgrade() -> None:
    create_table(
        "relay_runs",
        sa.Column("id", identifier(), nullable=False),
        sa.Column("repo", identifier(), nullable=False),
        sa.Column("workflow", identifier(), nullable=False),
        sa.Column("ticket_id", identifier(), nullable=False),
        sa.Column("ticket_key", identifier(), nullable=False),
        sa.Column("state", identifier(), nullable=False),
        sa.Column("current_node", identifier(), nullable=True),
        sa.Column("current_node_visit_id", identifier(), nullable=True),
        sa.Column("last_error", free_text(), nullable=True),
        sa.Column("started_at", utc_timestamp(), nullable=False),
        sa.Column("updated_at", utc_timestamp(), nullable=False),
        sa.Column("finished_at", utc_timestamp(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_relay_runs"),
    )
    create_index("relay_runs_ticket_key", "relay_runs", ["ticket_key"])
    create_index("relay_runs_workflow_state", "relay_runs", ["workflow", "state"])
    create_index("relay_runs_repo_state", "relay_runs", ["repo", "state"])


def downgrade() -> None:
    op.drop_index("relay_runs_repo_state", table_name="relay_runs")
    op.drop_index("relay_runs_workflow_state", table_name="relay_runs")
    op.drop_index("relay_runs_ticket_key", table_name="relay_runs")
    op.drop_table("relay_runs")
