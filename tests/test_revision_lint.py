"""The migration linter CI runs (.ci/lint_revisions.py: squawk on each revision's SQL)
fails a revision that would block a live table, unless the revision justifies it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relay_flow_projection.migrate import head_revision

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ROOT / "relay_flow_projection" / "migrations" / "versions"
LINT = ROOT / ".ci" / "lint_revisions.py"

NEXT_REVISION = '''"""A test revision on top of the chain."""

import sqlalchemy as sa
from alembic import op

from relay_flow_projection.migrations.frozen_v2 import lint_exemption

revision = "0006_lint_probe"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
{body}


def downgrade() -> None:
    pass
'''


def _lint(versions: Path | None = None) -> subprocess.CompletedProcess[str]:
    arguments = [] if versions is None else ["--versions", str(versions)]
    return subprocess.run(
        [sys.executable, str(LINT), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _chain_with(tmp_path: Path, body: str) -> Path:
    versions = tmp_path / "versions"
    shutil.copytree(VERSIONS, versions, ignore=shutil.ignore_patterns("__pycache__"))
    text = NEXT_REVISION.format(head=head_revision(), body=body)
    (versions / "0006_lint_probe.py").write_text(text, encoding="utf-8")
    return versions


def test_the_chain_passes_the_linter() -> None:
    result = _lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no findings" in result.stdout


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        ('    op.create_index("relay_runs_by_state", "relay_runs", ["state"])',
         "require-concurrent-index-creation"),
        ('    op.add_column("relay_runs", sa.Column("n", sa.Integer(), nullable=False))',
         "adding-required-field"),
        ('    op.alter_column("relay_runs", "ticket_key", new_column_name="key")',
         "renaming-column"),
    ],
    ids=["blocking-index-build", "not-null-column", "rename"],
)  # fmt: skip
def test_a_revision_that_blocks_a_live_table_fails_unless_justified(
    body: str, rule: str, tmp_path: Path
) -> None:
    failed = _lint(_chain_with(tmp_path / "plain", body))
    assert failed.returncode != 0
    assert "0006_lint_probe.sql" in failed.stdout
    assert rule in failed.stdout
    assert "lint_exemption" in failed.stdout

    justified = f'    lint_exemption("{rule}", "relay_runs is empty when this runs")\n{body}'
    passed = _lint(_chain_with(tmp_path / "justified", justified))
    assert passed.returncode == 0, passed.stdout + passed.stderr
