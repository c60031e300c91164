"""Generation 3 (relay-flow 0.2.5): attempt identities and the executor identity marker.

Revision ID: 0003_generation_3
Revises: 0002_generation_2
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relay_flow_projection.migrations.frozen_v1 import (
    create_table,
    free_text,
    identifier,
)
from relay_flow_projection.migrations.frozen_v2 import add_column

revision: str = "0003_generation_3"
down_revision: str | Sequence[str] | None = "0002_generation_2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# downgrade() drops columns and the identity table: `downgrade` asks for --yes (README).
downgrade_keeps_data: bool = False


def upgrade() -> None:
    add_column("relay_runs", sa.Column("logical_run_id", identifier(), nullable=True))
    add_column("relay_runs", sa.Column("attempt_id", sa.Integer(), nullable=True))
    create_table(
        "relay_executor_identity",
        sa.Column("singleton", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("executor_plugin", free_text(), nullable=False),
        sa.Column("temporal_address", free_text(), nullable=True),
        sa.Column("temporal_namespace", free_text(), nullable=True),
        sa.CheckConstraint("singleton = 1", name="ck_relay_executor_identity_singleton"),
        sa.PrimaryKeyConstraint("singleton", name="pk_relay_executor_identity"),
    )


def downgrade() -> None:
    op.drop_table("relay_executor_identity")
    with op.batch_alter_table("relay_runs") as batch:
        batch.drop_column("attempt_id")
        batch.drop_column("logical_run_id")
