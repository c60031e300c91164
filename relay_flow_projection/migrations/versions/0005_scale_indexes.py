"""Indexes for keyset paging, active-run listings, latest-attempt lookups and retention.

The partial indexes carry the terminal states as literals; queries render the
same literals (never bound parameters) so both planners can use them.

relay_runs is live when this runs (a rolling deploy): since 0.5.0 the indexes
are built without blocking its writers (frozen_v2.create_index: CONCURRENTLY
on PostgreSQL, online DDL on MySQL), each build committed on its own. The
indexes are the same as 0.4.0 built (tests/test_live_upgrades.py).

Revision ID: 0005_scale_indexes
Revises: 0004_adopt_legacy_rows
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from relay_flow_projection.migrations.frozen_v2 import create_index, index_builds

revision: str = "0005_scale_indexes"
down_revision: str | Sequence[str] | None = "0004_adopt_legacy_rows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# downgrade() drops indexes only: no --yes needed (README).
downgrade_keeps_data: bool = True

ACTIVE = sa.text("state NOT IN ('canceled', 'completed')")
TERMINAL = sa.text("state IN ('canceled', 'completed')")


def upgrade() -> None:
    with index_builds():
        create_index("relay_runs_list_order", "relay_runs", ["started_at", "id"])
        create_index(
            "relay_runs_logical_attempts",
            "relay_runs",
            ["logical_run_id", "started_at", "attempt_id"],
        )
        for name, column in (
            ("relay_runs_active_workflow", "workflow"),
            ("relay_runs_active_repo", "repo"),
        ):
            create_index(
                name,
                "relay_runs",
                [column, "started_at", "id"],
                sqlite_where=ACTIVE,
                postgresql_where=ACTIVE,
            )
        create_index(
            "relay_runs_sweepable",
            "relay_runs",
            ["finished_at"],
            sqlite_where=TERMINAL,
            postgresql_where=TERMINAL,
        )


def downgrade() -> None:
    for name in (
        "relay_runs_sweepable",
        "relay_runs_active_repo",
        "relay_runs_active_workflow",
        "relay_runs_logical_attempts",
        "relay_runs_list_order",
    ):
        op.drop_index(name, table_name="relay_runs")
