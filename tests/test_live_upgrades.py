"""Live upgrades (API.md, *Live upgrades*): the chain runs while the previous release writes.

- 0.5.0 rewrote released revisions (concurrent index builds, online DDL, short
  batches that touch only rows needing a repair): a database upgraded by their
  0.4.0 text (tests/data/revisions_0.4.0) and one upgraded by today's are the
  same, catalog for catalog and row for row, on every backend.
- A concurrent index build whose connection is lost leaves an INVALID index;
  the next upgrade drops it and builds it again. Writes go on meanwhile.
- A statement waiting for a table lock gives up after DDL_LOCK_TIMEOUT, so the
  writers queued behind it get through; its revision is retried with backoff,
  logging who holds the lock, until RELAY_FLOW_MIGRATION_LOCK_TIMEOUT, and then
  the upgrade fails in one line naming the holder.

The PostgreSQL tests that hold a snapshot or a lock do it in a database of
their own: a concurrent index build waits for every older snapshot in its
database, and other tests build indexes in the shared one.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from conftest import (
    ALEMBIC,
    MySQLDatabases,
    PostgresSchemas,
    deployed_alembic,
    postgres_database_url,
    require_postgres,
)
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool
from test_migrations import (
    REVISIONS,
    T0,
    connected,
    insert,
    rows,
    run_values,
    schema_catalog,
    table,
)

from relay_flow_projection import RunProjection, RunStart, create_engine, upgrade
from relay_flow_projection.live_upgrade import DDL_LOCK_TIMEOUT
from relay_flow_projection.migrate import alembic_config, head_revision

RELEASED_0_4_0 = Path(__file__).resolve().parent / "data" / "revisions_0.4.0"
RELAY_TABLES = (
    "relay_runs",
    "relay_node_runtime",
    "relay_processed_reports",
    "relay_node_sessions",
    "relay_executor_identity",
)


def _upgrade_with(versions: Path | None, url: str, revision: str) -> None:
    """Upgrade *url* to *revision* with the revisions in *versions* (None: today's)."""
    config = alembic_config(url)
    if versions is not None:
        config.set_main_option("path_separator", "os")
        config.set_main_option("version_locations", str(versions))
    command.upgrade(config, revision)


def _needing_repairs(count: int) -> list[dict[str, Any]]:
    """Runs at 0003 as older writers left them: one in three needs 0004's repairs."""
    damages: dict[int, dict[str, Any]] = {
        0: {"logical_run_id": None, "attempt_id": None, "current_node": ""},
        1: {"logical_run_id": "", "attempt_id": 0, "last_error": ""},
    }
    runs = []
    for index in range(count):
        damaged = damages.get(index % 3, {"logical_run_id": f"r{index:05d}", "attempt_id": 1})
        runs.append(run_values(f"r{index:05d}", index, **damaged))
    return runs


def _runtime_rows(count: int) -> list[dict[str, Any]]:
    return [
        {
            "run_id": f"r{index:05d}",
            "node": "build",
            "terminal_id": "" if index % 2 else f"t{index}",
            "session_id": "" if index % 4 == 1 else None,
            "node_visit_id": f"v{index}",
            "updated_at": T0 + timedelta(seconds=index),
        }
        for index in range(0, count, 5)
    ]


def _new_database(
    dialect: str, path: Path, schemas: PostgresSchemas, databases: MySQLDatabases
) -> str:
    if dialect == "postgresql":
        return schemas.new_url()
    if dialect == "mysql":
        return databases.new_url()
    return str(path)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mysql"])
def test_the_released_and_the_rewritten_revisions_build_the_same_database(
    dialect: str,
    tmp_path: Path,
    postgres_schemas: PostgresSchemas,
    mysql_databases: MySQLDatabases,
) -> None:
    def new(name: str) -> str:
        return _new_database(dialect, tmp_path / name, postgres_schemas, mysql_databases)

    # From base to head, empty ...
    empty_released, empty_today = new("empty-released.db"), new("empty-today.db")
    _upgrade_with(RELEASED_0_4_0, empty_released, "head")
    _upgrade_with(None, empty_today, "head")
    assert schema_catalog(empty_released) == schema_catalog(empty_today)

    # ... and from 0003 with rows to repair, in more than one batch of the servers'.
    released, today = new("released.db"), new("today.db")
    for versions, url in ((RELEASED_0_4_0, released), (None, today)):
        _upgrade_with(versions, url, REVISIONS[2])
        insert(url, "relay_runs", _needing_repairs(2_500))
        insert(url, "relay_node_runtime", _runtime_rows(2_500))
        _upgrade_with(versions, url, "head")

    assert schema_catalog(released) == schema_catalog(today)
    for name in RELAY_TABLES:
        assert rows(released, name) == rows(today, name), name
    repaired = rows(today, "relay_runs", ("id", "logical_run_id", "attempt_id", "current_node"))
    assert repaired[0] == {"id": "r00000", "logical_run_id": "r00000", "attempt_id": 1,
                           "current_node": None}  # fmt: skip


# ------------------------------------------------- PostgreSQL, own database ---


@pytest.fixture
def own_postgres_database() -> Iterator[str]:
    """A PostgreSQL database of this test's own (see the module docstring)."""
    require_postgres()
    name = f"relay_fp_live_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(
        postgres_database_url().set(database="postgres"),
        isolation_level="AUTOCOMMIT",
        poolclass=NullPool,
    )
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_database_url().set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _start_upgrade(url: str, cwd: Path, patience: float = 60.0) -> subprocess.Popen[str]:
    environment = {**os.environ, "RELAY_FLOW_MIGRATION_LOCK_TIMEOUT": str(patience)}
    return subprocess.Popen(
        [str(ALEMBIC), "-x", f"url={url}", "upgrade", "head"],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(connection: Connection, query: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = connection.execute(sa.text(query)).scalar()
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError(f"nothing answered {query!r} within {timeout} s")


def _index_validity(url: str) -> dict[str, bool]:
    with connected(url) as connection:
        found = connection.execute(
            sa.text(
                "SELECT c.relname, i.indisvalid FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname LIKE 'relay\\_runs\\_%'"
            )
        ).all()
    return {name: valid for name, valid in found}


def test_an_index_build_cut_off_is_rebuilt_and_writes_go_on_meanwhile(
    own_postgres_database: str, deployer: Path, postgres_schemas: PostgresSchemas
) -> None:
    url = own_postgres_database
    upgrade(url, REVISIONS[3])
    insert(url, "relay_runs", [run_values(f"r{i}", i, logical_run_id=f"r{i}", attempt_id=1)
                               for i in range(50)])  # fmt: skip
    watcher = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    holder = sa.create_engine(url, poolclass=NullPool)
    with watcher.connect() as watch, holder.connect() as snapshot:
        # An old snapshot: the first concurrent build waits for it, its index
        # already in the catalog, not yet valid.
        snapshot.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        snapshot.exec_driver_sql("SELECT count(*) FROM relay_node_sessions").scalar()
        upgrader = _start_upgrade(url, deployer)
        building = _wait_for(
            watch,
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'CREATE INDEX CONCURRENTLY relay_runs_list_order%'",
        )
        # The build blocks no writer: a run is written through the API meanwhile.
        engine = create_engine(url, lock_timeout=5.0)
        projection = RunProjection(engine)
        projection.insert_start(RunStart("during", "acme/app", "deliver", "T-1", "ACME-1"), T0)
        engine.dispose()
        # The build's connection is lost.
        watch.exec_driver_sql(f"SELECT pg_terminate_backend({int(building)})")
        _, errors = upgrader.communicate(timeout=60)
        assert upgrader.returncode != 0
        assert "Traceback" not in errors, errors
        snapshot.rollback()
    watcher.dispose()
    holder.dispose()
    left = _index_validity(url)
    assert left["relay_runs_list_order"] is False
    assert "relay_runs_logical_attempts" not in left  # the builds after it never started

    again = deployed_alembic(url, deployer, "upgrade", "head")
    assert again.returncode == 0, again.stderr
    assert "relay_runs_list_order: an interrupted build left this index invalid" in again.stderr
    checked = deployed_alembic(url, deployer, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert set(_index_validity(url).values()) == {True}
    fresh = postgres_schemas.new_url()
    upgrade(fresh)
    assert schema_catalog(url) == schema_catalog(fresh)
    assert {row["id"] for row in rows(url, "relay_runs", ("id",))} >= {"during", "r0"}


# ------------------------------------------------------ waits for a lock ---


@pytest.fixture(params=["postgresql", "mysql"])
def live_url(request: pytest.FixtureRequest, mysql_databases: MySQLDatabases) -> tuple[str, str]:
    """(dialect, URL) of a database of this test's own, at 0001 with some runs."""
    if request.param == "mysql":
        url = mysql_databases.new_url()
    else:
        url = request.getfixturevalue("own_postgres_database")
    upgrade(url, REVISIONS[0])
    insert(url, "relay_runs", [run_values(f"r{i}", i) for i in range(20)])
    return request.param, url


def _session_id(connection: Connection, dialect: str) -> int:
    query = "SELECT pg_backend_pid()" if dialect == "postgresql" else "SELECT CONNECTION_ID()"
    return int(connection.exec_driver_sql(query).scalar_one())


class Writer(threading.Thread):
    """Writes one run after another, each in a transaction of its own, timing each."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.engine = sa.create_engine(url, poolclass=NullPool)
        self.stop = threading.Event()
        self.waits: list[float] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        with self.engine.connect() as connection:
            for index in range(100_000):
                if self.stop.is_set():
                    return
                started = time.monotonic()
                try:
                    values = run_values(f"w{index:05d}", index)
                    connection.execute(sa.insert(_runs_at_0001(values)), values)
                    connection.commit()
                except Exception as exc:  # reported by the test
                    self.errors.append(exc)
                    return
                self.waits.append(time.monotonic() - started)
                time.sleep(0.02)


def _runs_at_0001(values: dict[str, Any]) -> sa.TableClause:
    return table("relay_runs", *values)


def test_a_revision_waiting_for_a_lock_backs_off_and_lets_writers_through(
    live_url: tuple[str, str], deployer: Path
) -> None:
    dialect, url = live_url
    holder = sa.create_engine(url, poolclass=NullPool)
    writer = Writer(url)
    with holder.connect() as reader:
        # A long reader: 0002's ALTER TABLE relay_runs waits for it.
        reader_id = _session_id(reader, dialect)
        reader.exec_driver_sql("SELECT count(*) FROM relay_runs").scalar()
        upgrader = _start_upgrade(url, deployer)
        writer.start()
        held = 6.0
        time.sleep(held)
        reader.rollback()
    _, errors = upgrader.communicate(timeout=120)
    writer.stop.set()
    writer.join(timeout=30)
    writer.engine.dispose()
    holder.dispose()

    assert upgrader.returncode == 0, errors
    kind = "PostgreSQL backend" if dialect == "postgresql" else "MySQL connection"
    assert f"waited for a lock held by {kind} {reader_id}" in errors, errors
    assert "retrying in" in errors
    assert writer.errors == []
    # Writers queued behind the waiting ALTER TABLE at most one DDL_LOCK_TIMEOUT
    # at a time, not for the whole time the reader held the table.
    assert len(writer.waits) >= 10, writer.waits
    assert max(writer.waits) < held / 2, max(writer.waits)
    assert held / 2 > DDL_LOCK_TIMEOUT
    with connected(url) as connection:
        version = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    assert version == head_revision()


def test_a_lock_held_past_the_patience_fails_in_one_line_naming_its_holder(
    live_url: tuple[str, str], deployer: Path
) -> None:
    dialect, url = live_url
    holder = sa.create_engine(url, poolclass=NullPool)
    with holder.connect() as reader:
        reader_id = _session_id(reader, dialect)
        reader.exec_driver_sql("SELECT count(*) FROM relay_runs").scalar()
        upgrader = _start_upgrade(url, deployer, patience=3.0)
        output, errors = upgrader.communicate(timeout=60)
        reader.rollback()
    holder.dispose()

    assert upgrader.returncode != 0
    assert "Traceback" not in output + errors
    failure = output.strip().splitlines()[-1]  # Alembic prints its FAILED line to stdout
    assert failure.startswith("FAILED: migrating "), output + errors
    kind = "PostgreSQL backend" if dialect == "postgresql" else "MySQL connection"
    assert f"held by {kind} {reader_id}" in failure
    assert "gave up after" in failure
    assert "RELAY_FLOW_MIGRATION_LOCK_TIMEOUT" in failure
    with connected(url) as connection:
        version = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    assert version == REVISIONS[0]
    assert deployed_alembic(url, deployer, "upgrade", "head").returncode == 0
