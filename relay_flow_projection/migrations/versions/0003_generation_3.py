"""Generation 3 (relay-flow 0.2.5): attempt identities and the executor identity marker.

Revision ID: 0003_generation_3
Revises: 0002_generation_2
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_generation_3"
down_revision: str | Sequence[str] | None = "0002_generation_2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("relay_runs", sa.Column("logical_run_id", sa.Text(), nullable=True))
    op.add_column("relay_runs", sa.Column("attempt_id", sa.Integer(), nullable=True))
    op.create_table(
        "relay_executor_identity",
        sa.Column("singleton", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("executor_plugin", sa.Text(), nullable=False),
        sa.Column("temporal_address", sa.Text(), nullable=True),
        sa.Column("temporal_namespace", sa.Text(), nullable=True),
        sa.CheckConstraint("singleton = 1", name="ck_relay_executor_identity_singleton"),
        sa.PrimaryKeyConstraint("singleton", name="pk_relay_executor_identity"),
    )


def downgrade() -> None:
    op.drop_table("relay_executor_identity")
    with op.batch_alter_table("relay_runs") as batch:
        batch.drop_column("attempt_id")
        batch.drop_column("logical_run_id")
