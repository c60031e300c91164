"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

# This revision will run while the previous release keeps writing (README,
# "Writing a revision"; .ci/lint_revisions.py lints its SQL in CI):
# - expand, then contract: add columns nullable, without a default
#   (frozen_v2.add_column); backfill in short keyset batches, each its own
#   transaction, touching only rows that need it; constrain and drop in a
#   later release, drops last;
# - indexes on existing tables: `with frozen_v2.index_builds():` and
#   frozen_v2.create_index (CONCURRENTLY on PostgreSQL, online on MySQL);
# - constraints NOT VALID here, VALIDATE in the next revision;
# - MySQL commits each DDL statement: every step must be re-runnable;
# - import no live package code (frozen_v1's docstring); a justified
#   exception to a lint rule: frozen_v2.lint_exemption(rule, why).

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision: str = ${repr(up_revision)}
down_revision: str | Sequence[str] | None = ${repr(down_revision)}
branch_labels: str | Sequence[str] | None = ${repr(branch_labels)}
depends_on: str | Sequence[str] | None = ${repr(depends_on)}
# True only if downgrade() deletes no rows, columns or tables (an index-only
# revision); otherwise `relay-flow-projection downgrade` past it needs --yes.
downgrade_keeps_data: bool = False


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
