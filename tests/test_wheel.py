"""The built wheel works on its own: installed in a fresh virtualenv, run outside the repository.

``upgrade()`` must find the Alembic chain inside the installed package (the
wheel's ``relay_flow_projection/migrations``, which Alembic addresses as
``relay_flow_projection:migrations``), from any working directory, and a
deployer's two-line ``alembic.ini`` drives the whole chain.
Slow (a build and an install from the package index) but part of the default run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TWO_LINE_INI, set_versions
from sqlalchemy.pool import NullPool

from relay_flow_projection.engine import resolve_target
from relay_flow_projection.migrate import head_revision

REPOSITORY = Path(__file__).resolve().parents[1]
MIGRATION_SCRIPTS = sorted(
    p.name for p in (REPOSITORY / "relay_flow_projection" / "migrations" / "versions").glob("*.py")
)

pytestmark = pytest.mark.slow


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.pop("RELAY_FLOW_DATABASE_URL", None)
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(REPOSITORY)], out)
    (built,) = out.glob("relay_flow_projection-*.whl")
    return built


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(root / "env")], root)
    python = root / "env" / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", f"{wheel}[postgresql]"], root)
    return python


def test_wheel_carries_the_migrations_and_the_type_marker(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "relay_flow_projection/py.typed" in names
    assert "relay_flow_projection/migrations/env.py" in names
    assert "relay_flow_projection/migrations/script.py.mako" in names
    versions = sorted(
        name.rsplit("/", 1)[1]
        for name in names
        if name.startswith("relay_flow_projection/migrations/versions/")
    )
    assert versions == MIGRATION_SCRIPTS
    assert len(versions) >= 5
    assert not [n for n in names if n.startswith(("tests/", "migrations/", "benchmarks/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def _installed_upgrade(python: Path, cwd: Path, target: str) -> dict[str, Any]:
    script = """
import json, sys
import relay_flow_projection as r
from relay_flow_projection import migrate
r.upgrade(sys.argv[1])
print(json.dumps({
    "package": r.__file__,
    "migrations": str(migrate.migrations_directory()),
    "head": migrate.head_revision(),
    "nonterminal": r.has_nonterminal_runs(sys.argv[1]),
}))
"""
    result = _run([str(python), "-c", script, target], cwd)
    info: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return info


def _versions(target: str) -> list[str]:
    engine = sa.create_engine(
        resolve_target(target).url.render_as_string(hide_password=False), poolclass=NullPool
    )
    try:
        with engine.connect() as connection:
            query = sa.text("SELECT version_num FROM alembic_version")
            return list(connection.execute(query).scalars())
    finally:
        engine.dispose()


def test_installed_wheel_upgrades_sqlite_from_any_directory(
    venv_python: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    info = _installed_upgrade(venv_python, elsewhere, "x.db")

    venv_root = venv_python.parent.parent
    assert Path(info["package"]).is_relative_to(venv_root)
    assert Path(info["migrations"]) == Path(info["package"]).parent / "migrations"
    assert info["head"] == head_revision()
    assert info["nonterminal"] is False
    database = elsewhere / "x.db"
    assert database.is_file()
    assert _versions(str(database)) == [head_revision()]


def test_installed_wheel_upgrades_postgresql(
    venv_python: Path, postgres_url: str, tmp_path: Path
) -> None:
    info = _installed_upgrade(venv_python, tmp_path, postgres_url)
    assert info["head"] == head_revision()
    assert _versions(postgres_url) == [head_revision()]


# What API.md tells a deployer without a checkout to write.


def _alembic(python: Path, cwd: Path, *args: str, url: str, ok: bool = True) -> str:
    """The installed package's ``alembic`` console script, run in ``cwd``."""
    command = [str(python.parent / "alembic"), "-x", f"url={url}", *args]
    if ok:
        result = _run(command, cwd)
    else:
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert result.returncode != 0, result.stdout
        assert "Traceback" not in result.stdout + result.stderr
    return result.stdout + result.stderr


def _relay_tables(target: str) -> set[str]:
    engine = sa.create_engine(
        resolve_target(target).url.render_as_string(hide_password=False), poolclass=NullPool
    )
    try:
        return {name for name in sa.inspect(engine).get_table_names() if name.startswith("relay_")}
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_line_ini_upgrades_checks_and_downgrades(
    venv_python: Path, tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    deploy = tmp_path / "deploy"  # an empty directory: no checkout, no env.py
    deploy.mkdir()
    (deploy / "alembic.ini").write_text(TWO_LINE_INI)
    database = deploy / "projection.db"
    url = (
        f"sqlite:///{database}"
        if backend == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )

    # Reading commands create nothing: on a missing SQLite file they say so.
    if backend == "sqlite":
        missing = _alembic(venv_python, deploy, "current", url=url, ok=False)
        assert "does not exist" in missing
        assert not database.exists()
    else:
        _alembic(venv_python, deploy, "current", url=url)

    offline = _alembic(venv_python, deploy, "upgrade", "head", "--sql", url=url)
    assert "CREATE TABLE relay_runs" in offline
    if backend == "sqlite":
        assert not database.exists()

    _alembic(venv_python, deploy, "upgrade", "head", url=url)
    assert _versions(url) == [head_revision()]
    assert "No new upgrade operations detected" in _alembic(venv_python, deploy, "check", url=url)
    assert head_revision() in _alembic(venv_python, deploy, "current", url=url)
    history = _alembic(venv_python, deploy, "history", url=url)
    for script in MIGRATION_SCRIPTS:
        assert script.removesuffix(".py") in history

    _alembic(venv_python, deploy, "downgrade", "-1", url=url)
    assert _versions(url) == [MIGRATION_SCRIPTS[-2].removesuffix(".py")]
    behind = _alembic(venv_python, deploy, "check", url=url, ok=False)
    assert "Target database is not up to date" in behind
    _alembic(venv_python, deploy, "downgrade", "base", url=url)
    assert _versions(url) == []
    assert _relay_tables(url) == set()
    _alembic(venv_python, deploy, "upgrade", "head", url=url)
    assert _versions(url) == [head_revision()]
    assert "No new upgrade operations detected" in _alembic(venv_python, deploy, "check", url=url)
    # Only the database was written: no lock file or anything else stays behind (SQLite
    # in WAL mode may keep its -wal and -shm files beside the database: they are its own).
    left = {p.name for p in deploy.iterdir()} - {"projection.db-wal", "projection.db-shm"}
    assert left == ({"alembic.ini", "projection.db"} if backend == "sqlite" else {"alembic.ini"})


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_deployer_errors_from_the_installed_alembic_are_one_line(
    venv_python: Path, tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "alembic.ini").write_text(TWO_LINE_INI)
    url = (
        f"sqlite:///{deploy / 'projection.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    _alembic(venv_python, deploy, "upgrade", "head", url=url)
    set_versions(url, "0099_from_a_newer_release")
    for command in (["current"], ["check"], ["upgrade", "head"]):
        said = _alembic(venv_python, deploy, *command, url=url, ok=False)
        (line,) = said.strip().splitlines()
        assert "0099_from_a_newer_release" in line
        assert "upgrade the relay-flow-projection package" in line

    for bad, fragment in [
        ("postgresql+psycopg://u@localhost/db?port=notaport", "the port must be a number"),
        ("postgresql+psycopg://u@localhost:notaport/db", "the port must be a number"),
        ("nosuchdialect://x/y", "invalid database URL"),
    ]:
        (line,) = _alembic(venv_python, deploy, "current", url=bad, ok=False).strip().splitlines()
        assert fragment in line, line


def test_a_missing_driver_names_the_extra_from_the_installed_alembic(
    venv_python: Path, tmp_path: Path
) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "alembic.ini").write_text(TWO_LINE_INI)
    # As if the wheel were installed without its [postgresql] extra.
    code = "import sys; sys.modules['psycopg'] = None; from alembic.config import main; main()"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    for command in (["current"], ["upgrade", "head"]):
        result = subprocess.run(
            [str(venv_python), "-c", code, "-x", "url=postgresql://u@127.0.0.1/x", *command],
            cwd=deploy, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode != 0
        said = result.stdout + result.stderr
        assert "Traceback" not in said
        (line,) = said.strip().splitlines()
        assert 'pip install "relay-flow-projection[postgresql]"' in line


def test_the_installed_console_script_runs_without_a_checkout(
    venv_python: Path, tmp_path: Path
) -> None:
    script = str(venv_python.parent / "relay-flow-projection")
    _run([script, "--help"], tmp_path)
    _run([script, "--db", "projection.db", "init"], tmp_path)
    current = _run([script, "--db", "projection.db", "current"], tmp_path).stdout
    assert current == f"projection.db: {head_revision()} (head)\n"
    assert head_revision() in _run([script, "history"], tmp_path).stdout


def test_command_line_url_wins_over_the_environment(venv_python: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    (deploy / "alembic.ini").write_text(TWO_LINE_INI)
    env_db, cli_db = deploy / "from-env.db", deploy / "from-cli.db"
    command = [str(venv_python.parent / "alembic"), "-x", f"url=sqlite:///{cli_db}"]
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["RELAY_FLOW_DATABASE_URL"] = f"sqlite:///{env_db}"
    result = subprocess.run(
        [*command, "upgrade", "head"],
        cwd=deploy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert cli_db.is_file()
    assert not env_db.exists()
