"""The migration lock: concurrent upgrades serialize, a waiter gives up naming the holder,
and no lock (PostgreSQL advisory lock, SQLite lock file) outlives the upgrade."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from relay_flow_projection import upgrade
from relay_flow_projection.engine import build_engine, resolve_target
from relay_flow_projection.errors import DatabaseBusy, ProjectionError
from relay_flow_projection.migrate import head_revision, run_upgrade
from relay_flow_projection.migration_env import (
    LOCK_TIMEOUT_ENVIRONMENT_VARIABLE,
    MYSQL_LOCK_NAME,
    URL_ENVIRONMENT_VARIABLE,
    migration_lock,
)

if TYPE_CHECKING:
    from conftest import PostgresSchemas

REPOSITORY = Path(__file__).resolve().parents[1]
ALEMBIC = Path(sys.executable).parent / "alembic"


def _engine(url: str) -> sa.Engine:
    return build_engine(resolve_target(url), foreign_keys=False, poolclass=NullPool)


@contextmanager
def held_lock(url: str) -> Iterator[None]:
    """Hold the migration lock of *url* from another thread, as another upgrader would."""
    engine = _engine(url)
    taken, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def hold() -> None:
        try:
            with migration_lock(engine, 5.0, "test holder"):
                taken.set()
                release.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            failure.append(exc)
            taken.set()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(10)
        assert not failure, failure
        yield
    finally:
        release.set()
        thread.join(30)
        engine.dispose()


def _versions(url: str) -> list[str]:
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            return list(
                connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
            )
    finally:
        engine.dispose()


def _advisory_locks(url: str) -> int:
    engine = _engine(url)
    try:
        with engine.connect() as connection:
            query = sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            return int(connection.execute(query).scalar_one())
    finally:
        engine.dispose()


# On PostgreSQL directly and through a transaction-pooling PgBouncer, where a
# session-level lock would stay behind on whichever server connection took it.
THROUGH_A_POOLER_TOO = pytest.mark.parametrize("route", ["direct", "pgbouncer"])


@THROUGH_A_POOLER_TOO
def test_waiting_upgrader_gives_up_naming_the_holder(db_url: str) -> None:
    with held_lock(db_url), pytest.raises(DatabaseBusy) as raised:
        run_upgrade(db_url, lock_timeout=0.5)
    message = str(raised.value)
    assert "migration lock" in message
    assert "gave up after 0.5 s" in message
    assert LOCK_TIMEOUT_ENVIRONMENT_VARIABLE in message
    if db_url.startswith("postgresql"):
        assert "pid " in message
        assert "holding it since 20" in message
    if db_url.startswith("mysql"):
        assert "MySQL connection " in message
    # Once the holder is gone the same upgrade goes through.
    run_upgrade(db_url, lock_timeout=5)
    assert _versions(db_url) == [head_revision()]


@contextmanager
def busy_pool(url: str, clients: int) -> Iterator[None]:
    """Other clients keep the pooler's server connections busy meanwhile."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def client() -> None:
        engine = _engine(url)
        try:
            while not stop.is_set():
                with engine.connect() as connection:
                    connection.execute(sa.text("SELECT pg_sleep(0.01)"))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not failures, failures


@THROUGH_A_POOLER_TOO
def test_concurrent_upgrades_are_serialized_and_leave_no_lock(
    db_url: str, route: str, postgres_schemas: PostgresSchemas
) -> None:
    # Processes, not threads: Alembic's `context` proxy is one per process.
    script = (
        "import sys; from relay_flow_projection import migrate; migrate.run_upgrade(sys.argv[1])"
    )
    postgresql = db_url.startswith("postgresql")
    with busy_pool(db_url, 3) if postgresql else nullcontext():
        upgraders = [
            subprocess.Popen(
                [sys.executable, "-c", script, db_url],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        outcomes = [upgrader.communicate(timeout=120) for upgrader in upgraders]
    assert [upgrader.returncode for upgrader in upgraders] == [0] * 4, outcomes
    assert _versions(db_url) == [head_revision()]
    path = resolve_target(db_url).path
    if path is not None:
        assert not Path(f"{path}.migrate-lock").exists()
        return
    if not postgresql:
        assert _named_lock_holder(db_url) is None
        return
    assert _advisory_locks(db_url) == 0
    # Nothing left behind on any server connection: a direct upgrader is not kept waiting.
    direct = postgres_schemas.direct_url(db_url) if route == "pgbouncer" else db_url
    run_upgrade(direct, lock_timeout=2)
    assert _versions(direct) == [head_revision()]


def _named_lock_holder(mysql_url: str) -> int | None:
    """The connection holding the MySQL migration lock of *mysql_url*'s database, if any."""
    engine = _engine(mysql_url)
    try:
        with engine.connect() as connection:
            name = connection.execute(MYSQL_LOCK_NAME).scalar_one()
            holder = connection.execute(sa.select(sa.func.is_used_lock(name))).scalar_one()
            return None if holder is None else int(holder)
    finally:
        engine.dispose()


def test_the_mysql_lock_goes_with_its_connection(mysql_url: str) -> None:
    """A named lock belongs to its session: an upgrader whose connection dies (killed,
    a network cut) leaves no lock behind for the next one to wait for."""
    upgrade(mysql_url)
    engine = _engine(mysql_url)
    try:
        with migration_lock(engine, 1.0, "test"):
            holder = _named_lock_holder(mysql_url)
            assert holder is not None
            with pytest.raises(DatabaseBusy, match="MySQL connection"):
                run_upgrade(mysql_url, lock_timeout=0.2)
            killer = _engine(mysql_url)
            with killer.connect() as connection:
                connection.exec_driver_sql(f"KILL {holder}")
            killer.dispose()
            # KILL returns before the killed session has ended; its lock goes with it.
            deadline = time.monotonic() + 10
            while _named_lock_holder(mysql_url) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _named_lock_holder(mysql_url) is None
            run_upgrade(mysql_url, lock_timeout=2)  # not kept waiting
    finally:
        engine.dispose()


def test_the_lock_is_transaction_scoped(postgres_url: str) -> None:
    """No session-level advisory lock is ever taken: ending the lock's transaction frees it."""
    engine = _engine(postgres_url)
    try:
        with migration_lock(engine, 1.0, "test"):
            assert _advisory_locks(postgres_url) == 1
        assert _advisory_locks(postgres_url) == 0
    finally:
        engine.dispose()


def _alembic(
    url: str, *args: str, env_extra: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != URL_ENVIRONMENT_VARIABLE}
    env.update(env_extra)
    return subprocess.run(
        [str(ALEMBIC), "-c", str(REPOSITORY / "alembic.ini"), "-x", f"url={url}", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_command_line_waiter_times_out_in_one_line(db_url: str, tmp_path: Path) -> None:
    with held_lock(db_url):
        result = _alembic(
            db_url, "upgrade", "head",
            env_extra={LOCK_TIMEOUT_ENVIRONMENT_VARIABLE: "0.3"}, cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert "gave up after 0.3 s" in line


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_bad_lock_timeout_is_refused(value: str, sqlite_path: Path, tmp_path: Path) -> None:
    result = _alembic(
        f"sqlite:///{sqlite_path}", "upgrade", "head",
        env_extra={LOCK_TIMEOUT_ENVIRONMENT_VARIABLE: value}, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode != 0
    assert f"{LOCK_TIMEOUT_ENVIRONMENT_VARIABLE} must be a positive number" in result.stdout
    with pytest.raises(ProjectionError, match="lock_timeout must be a positive number"):
        run_upgrade(sqlite_path, lock_timeout=0)


HOLD_AND_WAIT = """
import sys, time
from sqlalchemy.pool import NullPool
from relay_flow_projection.engine import build_engine, resolve_target
from relay_flow_projection.migration_env import migration_lock
engine = build_engine(resolve_target(sys.argv[1]), foreign_keys=False, poolclass=NullPool)
with migration_lock(engine, 5.0, "killed holder"):
    print("held", flush=True)
    time.sleep(300)
"""


@pytest.mark.sqlite_only
def test_a_lock_file_left_by_a_killed_upgrader_is_harmless(sqlite_path: Path) -> None:
    """SIGKILL leaves <db>.migrate-lock behind, but the flock went with the process:
    the next upgrade takes it at once and removes the file."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, str(sqlite_path)],
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "held\n"
        finally:
            holder.kill()
    lock_file = Path(f"{sqlite_path}.migrate-lock")
    assert lock_file.exists()

    run_upgrade(sqlite_path, lock_timeout=1)  # DatabaseBusy if the lock were still held

    assert _versions(str(sqlite_path)) == [head_revision()]
    assert not lock_file.exists()
