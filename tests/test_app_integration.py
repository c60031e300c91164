"""An application with its own Alembic environment runs our chain from its own.

The supported recipe (README, "Deploying"): the application's ``alembic.ini``
lists our installed chain in ``version_locations`` beside its own revisions
(Alembic's multiple bases), and its autogenerate ignores the ``relay_*``
tables. One ``alembic upgrade heads`` in the application then brings both
chains up, ``alembic check`` there sees only the application's tables, and
``open_projection`` accepts the shared version table.

The test builds such an application in a temporary directory and runs the
real ``alembic`` console script in it, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from relay_flow_projection import RunProjection, open_projection
from relay_flow_projection.engine import resolve_target
from relay_flow_projection.migrate import head_revision

ALEMBIC = Path(sys.executable).parent / "alembic"

APP_INI = """\
[alembic]
script_location = %(here)s/app_migrations
version_locations = %(here)s/app_migrations/versions relay_flow_projection:migrations/versions
path_separator = space
"""

APP_ENV = '''\
"""The application's own Alembic environment (what a user writes)."""
import sqlalchemy as sa
from alembic import context

metadata = sa.MetaData()
sa.Table(
    "app_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
)


def include_name(name, type_, parent_names):
    """The relay_* tables belong to relay_flow_projection's revisions."""
    if type_ == "table":
        return not (name or "").startswith("relay_")
    return True


engine = sa.create_engine(context.get_x_argument(as_dictionary=True)["url"])
with engine.connect() as connection:
    context.configure(
        connection=connection, target_metadata=metadata, include_name=include_name
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
'''

APP_REVISION = '''\
"""the application's first table"""
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "app_orders",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
    )


def downgrade():
    op.drop_table("app_orders")
'''

SCRIPT_MAKO = '''\
"""${message}"""
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''


def _build_app(root: Path) -> Path:
    (root / "app_migrations" / "versions").mkdir(parents=True)
    (root / "alembic.ini").write_text(APP_INI)
    (root / "app_migrations" / "env.py").write_text(APP_ENV)
    (root / "app_migrations" / "script.py.mako").write_text(SCRIPT_MAKO)
    (root / "app_migrations" / "versions" / "app_0001.py").write_text(APP_REVISION)
    return root


def _alembic(app: Path, url: str, *args: str, ok: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RELAY_FLOW_DATABASE_URL"}
    result = subprocess.run(
        [str(ALEMBIC), "-x", f"url={url}", *args],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (result.returncode == 0) is ok, f"alembic {args}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _rows(url: str, query: str) -> list[str]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return sorted(str(row[0]) for row in connection.execute(sa.text(query)))
    finally:
        engine.dispose()


@pytest.fixture
def app_url(db_url: str) -> str:
    """A plain SQLAlchemy URL for the application's own engine."""
    return resolve_target(db_url).url.render_as_string(hide_password=False)


def test_one_upgrade_in_the_app_brings_both_chains_up(tmp_path: Path, app_url: str) -> None:
    app = _build_app(tmp_path / "app")

    _alembic(app, app_url, "upgrade", "heads")

    assert _rows(app_url, "SELECT version_num FROM alembic_version") == sorted(
        [head_revision(), "app_0001"]
    )
    # The projection opens on the database the application migrated, with or
    # without its own upgrade (which finds nothing to do).
    for upgrade in (False, True):
        with open_projection(app_url, upgrade=upgrade) as projection:
            assert isinstance(projection, RunProjection)
            assert projection.list_runs() == []

    # The application's check sees only its own tables as its own.
    assert "No new upgrade operations detected" in _alembic(app, app_url, "check")
    # Our own environment says who migrates this database instead of a traceback.
    ours = Path(__file__).resolve().parents[1]
    refused = _alembic(ours, app_url, "check", ok=False)
    assert "another chain's revisions (app_0001)" in refused
    assert "Traceback" not in refused

    # A second upgrade is a no-op; the application's downgrade of its branch leaves ours.
    _alembic(app, app_url, "upgrade", "heads")
    _alembic(app, app_url, "downgrade", "app_0001@-1")
    assert _rows(app_url, "SELECT version_num FROM alembic_version") == [head_revision()]
    with open_projection(app_url, upgrade=False) as projection:
        assert projection.list_runs() == []
