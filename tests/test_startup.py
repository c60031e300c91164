"""The base install and start-up: what importing and opening load (issue 22, items 4 and 7).

* ``from relay_flow_projection import *`` works without greenlet (the base
  install, no ``[async]`` extra), and the asyncio API then fails with one line
  naming the extra.
* Importing the package, opening a projection at head and reading it never
  load Alembic: the revision check is one query compared with HEAD_REVISION,
  which must equal the chain's real head. ``history`` reads the chain's files
  without Alembic, with Alembic's answer.

Each case runs in a fresh interpreter: what is in ``sys.modules`` is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import copy_head_sqlite

import relay_flow_projection
from relay_flow_projection.migrate import script_directory
from relay_flow_projection.revisions import HEAD_REVISION, chain_scripts

# A meta-path finder that makes greenlet unimportable, as on a base install.
BLOCK_GREENLET = textwrap.dedent(
    """
    import sys

    class _NoGreenlet:
        def find_spec(self, name, path=None, target=None):
            if name == "greenlet" or name.startswith("greenlet."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    for _name in [m for m in sys.modules if m == "greenlet" or m.startswith("greenlet.")]:
        del sys.modules[_name]
    sys.meta_path.insert(0, _NoGreenlet())
    """
)


def run_python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RELAY_FLOW_DATABASE_URL"}
    env["PYTHONWARNINGS"] = "error"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
        timeout=120,
    )


# ------------------------------------------------------------ base install ---


def test_import_star_works_without_greenlet(tmp_path: Path) -> None:
    code = BLOCK_GREENLET + textwrap.dedent(
        """
        from relay_flow_projection import *
        import relay_flow_projection
        missing = [n for n in relay_flow_projection.__all__ if n not in globals()]
        assert not missing, missing
        assert "greenlet" not in sys.modules
        print("ok")
        """
    )
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.sqlite_only
def test_the_asyncio_api_without_greenlet_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    copy_head_sqlite(tmp_path / "head.db")
    code = BLOCK_GREENLET + textwrap.dedent(
        """
        import asyncio
        from relay_flow_projection import (
            ExtraNotInstalled, ProjectionError, create_async_engine, open_async_projection,
        )

        def said(call):
            try:
                call()
            except ExtraNotInstalled as exc:
                assert isinstance(exc, ProjectionError) and isinstance(exc, ImportError)
                return str(exc)
            raise AssertionError("no ExtraNotInstalled")

        print(said(lambda: asyncio.run(open_async_projection(sys.argv[1]))))
        print(said(lambda: asyncio.run(open_async_projection(sys.argv[1], upgrade=True))))
        print(said(lambda: create_async_engine(sys.argv[1])))
        """
    )
    result = run_python(code, tmp_path, str(tmp_path / "head.db"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    for line in lines:
        assert 'pip install "relay-flow-projection[async]"' in line
        assert "sqlalchemy[asyncio]" not in line


def test_extra_not_installed_is_exported() -> None:
    assert "ExtraNotInstalled" in relay_flow_projection.__all__
    assert issubclass(relay_flow_projection.ExtraNotInstalled, ImportError)
    error = relay_flow_projection.ExtraNotInstalled
    assert issubclass(error, relay_flow_projection.ProjectionError)


# --------------------------------------------------------------- start-up ---


def test_head_revision_is_alembics_head() -> None:
    assert script_directory().get_current_head() == HEAD_REVISION


def test_the_chain_read_without_alembic_is_alembics() -> None:
    scripts = chain_scripts()
    assert scripts is not None
    walked = list(script_directory().walk_revisions())
    assert [(s.revision, s.down_revision, s.doc) for s in scripts] == [
        (r.revision, r.down_revision, r.doc) for r in walked
    ]


OPEN_AND_READ = textwrap.dedent(
    """
    import sys
    from relay_flow_projection import RunFilter, open_projection

    projection = open_projection(sys.argv[1])
    projection.list_runs(RunFilter(), limit=1)
    projection.close()
    loaded = sorted(m for m in sys.modules if m == "alembic" or m.startswith("alembic."))
    print(loaded)
    """
)


def test_opening_and_reading_at_head_never_loads_alembic(migrated_url: str, tmp_path: Path) -> None:
    result = run_python(OPEN_AND_READ, tmp_path, migrated_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.sqlite_only
def test_opening_a_database_behind_head_still_says_so(tmp_path: Path) -> None:
    from relay_flow_projection import SchemaOutOfDate, open_projection, upgrade

    path = tmp_path / "old.db"
    upgrade(str(path), "0004_adopt_legacy_rows")
    with pytest.raises(
        SchemaOutOfDate, match=f"0004_adopt_legacy_rows, not at head {HEAD_REVISION}"
    ):
        open_projection(str(path))


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        """
        import atexit, sys
        atexit.register(
            lambda: print("alembic loaded" if "alembic" in sys.modules else "no alembic",
                          file=sys.stderr)
        )
        from relay_flow_projection.cli import main
        main()
        """
    )
    return run_python(code, tmp_path, *args)


@pytest.mark.sqlite_only
def test_status_and_history_do_not_load_alembic(tmp_path: Path) -> None:
    database = tmp_path / "head.db"
    copy_head_sqlite(database)
    status = _cli(tmp_path, "--db", str(database), "status")
    assert status.returncode == 0, status.stderr
    assert status.stderr.strip() == "no alembic"
    assert HEAD_REVISION in status.stdout
    history = _cli(tmp_path, "history", "--json")
    assert history.returncode == 0, history.stderr
    assert history.stderr.strip() == "no alembic"
    shown = json.loads(history.stdout)
    walked = list(script_directory().walk_revisions())
    assert shown == [
        {
            "revision": r.revision,
            "down_revision": r.down_revision,
            "head": r.revision == HEAD_REVISION,
            "message": r.doc,
        }
        for r in walked
    ]
