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
from relay_flow_projection.app_alembic import chain_versions_directory
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


SCRIPT_MAKO_WITH_LABELS = '''\
"""${message}"""
import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''

TWO_BRANCH_INI = """\
[alembic]
script_location = %(here)s/migrations
version_locations = %(here)s/migrations/versions relay_flow_projection:migrations/versions
path_separator = space
revision_environment = true
"""

# README's env.py of an application: its own models, our two hooks.
HOOKED_ENV = """\
import sqlalchemy as sa
from alembic import context

from relay_flow_projection import app_alembic

metadata = sa.MetaData()
sa.Table(
    "app_widgets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(64), nullable=False),
)

engine = sa.create_engine(context.get_x_argument(as_dictionary=True)["url"])
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_name=app_alembic.include_name,
        process_revision_directives=app_alembic.process_revision_directives,
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

TWO_LINE_INI = "[alembic]\nscript_location = relay_flow_projection:migrations\n"
SUGGESTION = (
    "alembic revision --autogenerate --head base --branch-label app "
    "--version-path migrations/versions -m widgets"
)


def _chain_files() -> set[str]:
    return {path.name for path in chain_versions_directory().iterdir()}


def _build_hooked_app(root: Path) -> Path:
    """An application as README's two-branch recipe builds it, with no revision yet."""
    (root / "migrations" / "versions").mkdir(parents=True)
    (root / "alembic.ini").write_text(TWO_BRANCH_INI)
    (root / "migrations" / "env.py").write_text(HOOKED_ENV)
    (root / "migrations" / "script.py.mako").write_text(SCRIPT_MAKO_WITH_LABELS)
    return root


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
    # Our own environment judges our branch only.
    ours = Path(__file__).resolve().parents[1]
    assert "No new upgrade operations detected" in _alembic(ours, app_url, "check")

    # A second upgrade is a no-op; the application's downgrade of its branch leaves ours.
    _alembic(app, app_url, "upgrade", "heads")
    _alembic(app, app_url, "downgrade", "app_0001@-1")
    assert _rows(app_url, "SELECT version_num FROM alembic_version") == [head_revision()]
    with open_projection(app_url, upgrade=False) as projection:
        assert projection.list_runs() == []


RELAY = Path(sys.executable).parent / "relay-flow-projection"


def _relay(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RELAY_FLOW_DATABASE_URL"}
    return subprocess.run(
        [str(RELAY), "--db", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_revision_on_top_of_our_chain_is_refused_with_the_right_command(
    tmp_path: Path, app_url: str
) -> None:
    app = _build_hooked_app(tmp_path / "app")
    before = _chain_files()
    _alembic(app, app_url, "upgrade", "heads")

    # The natural commands, with and without autogenerate: refused, nothing written.
    refused = _alembic(app, app_url, "revision", "--autogenerate", "-m", "widgets", ok=False)
    assert SUGGESTION in refused
    assert "0005_scale_indexes" in refused
    assert "Traceback" not in refused
    plain = _alembic(app, app_url, "revision", "-m", "widgets", ok=False)
    assert SUGGESTION.replace(" --autogenerate", "") in plain
    into_ours = _alembic(
        app,
        app_url,
        "revision",
        "--head",
        "base",
        "--version-path",
        str(chain_versions_directory()),
        "-m",
        "widgets",
        ok=False,
    )
    assert "versions directory" in into_ours
    assert _chain_files() == before
    assert list((app / "migrations" / "versions").iterdir()) == []


def test_the_two_branch_setup_end_to_end(tmp_path: Path, app_url: str) -> None:
    app = _build_hooked_app(tmp_path / "app")
    before = _chain_files()
    _alembic(app, app_url, "upgrade", "heads")

    # The suggested command starts the application's branch in its own directory.
    _alembic(app, app_url, *SUGGESTION.split()[1:])
    (first,) = (app / "migrations" / "versions").glob("*_widgets.py")
    text = first.read_text()
    first_id = first.name.split("_")[0]
    assert "down_revision = None" in text
    assert "branch_labels = ('app',)" in text
    assert "app_widgets" in text
    assert "relay_" not in text
    assert _chain_files() == before

    _alembic(app, app_url, "upgrade", "heads")
    assert _rows(app_url, "SELECT version_num FROM alembic_version") == sorted(
        [head_revision(), first_id]
    )

    # Nothing changed: an empty revision on the application's branch.
    _alembic(app, app_url, "revision", "--autogenerate", "--head", "app@head", "-m", "nothing")
    (empty,) = (app / "migrations" / "versions").glob("*_nothing.py")
    empty_text = empty.read_text()
    assert f"down_revision = {first_id!r}" in empty_text
    assert "op." not in empty_text
    _alembic(app, app_url, "upgrade", "heads")
    assert "No new upgrade operations detected" in _alembic(app, app_url, "check")
    assert _chain_files() == before


def test_our_tools_judge_our_branch_on_a_shared_database(tmp_path: Path, app_url: str) -> None:
    app = _build_hooked_app(tmp_path / "app")
    _alembic(app, app_url, "upgrade", "heads")
    _alembic(app, app_url, *SUGGESTION.split()[1:])
    _alembic(app, app_url, "upgrade", "heads")
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "alembic.ini").write_text(TWO_LINE_INI)

    assert f"{head_revision()} (head)" in _alembic(deploy, app_url, "current")
    assert "No new upgrade operations detected" in _alembic(deploy, app_url, "check")
    checked = _relay(app_url, "check")
    assert checked.returncode == 0, checked.stderr
    assert f"at head {head_revision()}, no drift" in checked.stdout
    current = _relay(app_url, "current")
    assert current.returncode == 0, current.stderr
    assert f"{head_revision()} (head)" in current.stdout

    # Our branch moves alone; the application's row stays.
    versions = "SELECT version_num FROM alembic_version"
    (app_head,) = [row for row in _rows(app_url, versions) if row != head_revision()]
    _alembic(deploy, app_url, "downgrade", "-1")
    assert _rows(app_url, versions) == sorted(["0004_adopt_legacy_rows", app_head])
    behind = _relay(app_url, "check")
    assert behind.returncode == 4  # EXIT_NOT_AT_HEAD
    assert "not at head" in behind.stderr
    _alembic(deploy, app_url, "upgrade", "head")
    assert _rows(app_url, versions) == sorted([head_revision(), app_head])
    assert "No new upgrade operations detected" in _alembic(app, app_url, "check")
