"""The Alembic chain: up and down with data, unknown revisions, the command line, failures.

Every test that is not about SQLite files runs on SQLite and PostgreSQL (``db_url``).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from conftest import PostgresSchemas, copy_head_sqlite, replay_head_ddl, text_of
from legacy_databases import schema_drift
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    ProjectionError,
    RunStart,
    RunState,
    SchemaOutOfDate,
    init_database,
    open_projection,
    upgrade,
)
from relay_flow_projection.engine import resolve_target
from relay_flow_projection.migrate import (
    alembic_config,
    head_revision,
    run_downgrade,
    script_directory,
)
from relay_flow_projection.migration_env import URL_ENVIRONMENT_VARIABLE
from relay_flow_projection.timestamps import UtcDateTime

REPOSITORY = Path(__file__).resolve().parents[1]
ALEMBIC_INI = REPOSITORY / "alembic.ini"
ALEMBIC = Path(sys.executable).parent / "alembic"
REVISIONS = [rev.revision for rev in reversed(list(script_directory().walk_revisions()))]
UNKNOWN_REVISION = "9999_from_a_newer_release"
T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

RUN_COLUMNS_1 = (
    "id",
    "repo",
    "workflow",
    "ticket_id",
    "ticket_key",
    "state",
    "current_node",
    "current_node_visit_id",
    "last_error",
    "started_at",
    "updated_at",
    "finished_at",
)
RUN_COLUMNS_2 = (*RUN_COLUMNS_1, "retry_error", "retry_attempt", "next_retry_at")
TIMESTAMP_COLUMNS = {"started_at", "updated_at", "finished_at", "next_retry_at", "created_at"}
CHILD_TABLES = ("relay_node_runtime", "relay_processed_reports", "relay_node_sessions")
ALL_TABLES = ("relay_runs", *CHILD_TABLES, "relay_executor_identity")


def test_the_chain_is_the_one_these_tests_know() -> None:
    assert REVISIONS == [
        "0001_generation_1",
        "0002_generation_2",
        "0003_generation_3",
        "0004_adopt_legacy_rows",
        "0005_scale_indexes",
    ]
    assert head_revision() == REVISIONS[-1]


# ----------------------------------------------------------------- helpers ---


def url_of(target: str) -> str:
    """A target as the URL string the alembic command line needs."""
    return resolve_target(target).url.render_as_string(hide_password=False)


@contextmanager
def connected(target: str) -> Iterator[Connection]:
    engine = sa.create_engine(url_of(target), poolclass=NullPool)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


@contextmanager
def plain_engine(target: str) -> Iterator[Engine]:
    engine = sa.create_engine(url_of(target), poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def versions(target: str) -> list[str] | None:
    """alembic_version from a new connection; None when the table does not exist."""
    with connected(target) as connection:
        if not sa.inspect(connection).has_table("alembic_version"):
            return None
        return list(
            connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
        )


def relay_tables(target: str) -> set[str]:
    with connected(target) as connection:
        return {
            name for name in sa.inspect(connection).get_table_names() if name.startswith("relay_")
        }


def relay_indexes(target: str) -> set[str]:
    with connected(target) as connection:
        return {index["name"] or "" for index in sa.inspect(connection).get_indexes("relay_runs")}


def rows(target: str, table: str, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """All rows of *table* (optionally only *columns*), ordered by primary key."""
    with connected(target) as connection:
        reflected = sa.Table(table, sa.MetaData(), autoload_with=connection)
        selected = [reflected.c[name] for name in columns] if columns else list(reflected.c)
        result = connection.execute(sa.select(*selected).order_by(*reflected.primary_key))
        return [{key: text_of(value) for key, value in row._mapping.items()} for row in result]


def table(name: str, *columns: str) -> sa.TableClause:
    return sa.table(
        name,
        *(
            sa.column(column, UtcDateTime()) if column in TIMESTAMP_COLUMNS else sa.column(column)
            for column in columns
        ),
    )


def insert(target: str, name: str, values: list[dict[str, Any]]) -> None:
    with connected(target) as connection:
        connection.execute(sa.insert(table(name, *values[0])), values)


def run_values(run_id: str, offset: int, **extra: Any) -> dict[str, Any]:
    started = T0 + timedelta(minutes=offset)
    return {
        "id": run_id,
        "repo": "acme/app",
        "workflow": "deliver",
        "ticket_id": f"T-{run_id}",
        "ticket_key": f"ACME-{run_id}",
        "state": "completed" if offset % 2 else "running",
        "current_node": None if offset % 2 else "build",
        "current_node_visit_id": None if offset % 2 else f"v-{run_id}",
        "last_error": "boom" if offset % 2 else None,
        "started_at": started,
        "updated_at": started + timedelta(seconds=30),
        "finished_at": started + timedelta(minutes=5) if offset % 2 else None,
        **extra,
    }


def alembic_cli(*args: str, cwd: Path, url: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``alembic`` command against the repository's alembic.ini."""
    env = {k: v for k, v in os.environ.items() if k != URL_ENVIRONMENT_VARIABLE}
    if url is not None:
        env[URL_ENVIRONMENT_VARIABLE] = url
    return subprocess.run(
        [str(ALEMBIC), "-c", str(ALEMBIC_INI), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# ---------------------------------------------------------------- up / down ---


def test_upgrade_to_head_then_down_to_base_and_up_again(db_url: str) -> None:
    upgrade(db_url)
    assert versions(db_url) == [head_revision()]
    assert relay_tables(db_url) == set(ALL_TABLES)

    run_downgrade(db_url, "base")
    assert relay_tables(db_url) == set()
    assert versions(db_url) == []

    upgrade(db_url)
    assert versions(db_url) == [head_revision()]
    assert relay_tables(db_url) == set(ALL_TABLES)
    with plain_engine(db_url) as engine:
        assert schema_drift(engine) == []


def test_each_step_up_and_down_keeps_the_rows_its_schema_holds(db_url: str, dialect: str) -> None:
    # 0001: runs only.
    upgrade(db_url, REVISIONS[0])
    insert(db_url, "relay_runs", [run_values(f"r{i}", i) for i in range(4)])
    gen1_runs = rows(db_url, "relay_runs")

    # 0002: retry columns and child tables; the runs are untouched.
    upgrade(db_url, REVISIONS[1])
    assert rows(db_url, "relay_runs", RUN_COLUMNS_1) == gen1_runs
    assert {(r["retry_error"], r["retry_attempt"]) for r in rows(db_url, "relay_runs")} == {
        (None, None)
    }
    with connected(db_url) as connection:
        connection.execute(
            sa.update(table("relay_runs", "id", "retry_error", "retry_attempt", "next_retry_at"))
            .where(sa.column("id") == "r0")
            .values(retry_error="flaky", retry_attempt=2, next_retry_at=T0 + timedelta(hours=1))
        )
    for i in range(4):
        insert(
            db_url,
            "relay_node_runtime",
            [
                {
                    "run_id": f"r{i}",
                    "node": node,
                    "terminal_id": f"term-{i}" if node == "build" else None,
                    "session_id": f"sess-{i}",
                    "node_visit_id": f"v-{i}",
                    "updated_at": T0 + timedelta(seconds=i),
                }
                for node in ("build", "test")
            ],
        )
        insert(
            db_url,
            "relay_processed_reports",
            [
                {
                    "run_id": f"r{i}",
                    "report_id": f"rep-{i}",
                    "node_visit_id": f"v-{i}",
                    "created_at": T0,
                }
            ],
        )
        insert(
            db_url,
            "relay_node_sessions",
            [
                {
                    "run_id": f"r{i}",
                    "node": "build",
                    "session_id": f"sess-{i}",
                    "node_visit_id": f"v-{i}",
                    "created_at": T0,
                }
            ],
        )
    gen2 = {name: rows(db_url, name) for name in ("relay_runs", *CHILD_TABLES)}

    # 0003: attempt columns (NULL until 0004) and the identity table.
    upgrade(db_url, REVISIONS[2])
    assert rows(db_url, "relay_runs", RUN_COLUMNS_2) == gen2["relay_runs"]
    for name in CHILD_TABLES:
        assert rows(db_url, name) == gen2[name]
    with connected(db_url) as connection:
        connection.execute(
            sa.update(table("relay_runs", "id", "logical_run_id", "attempt_id"))
            .where(sa.column("id") == "r1")
            .values(logical_run_id="logical-1", attempt_id=2)
        )
    insert(
        db_url,
        "relay_executor_identity",
        [{"singleton": 1, "executor_plugin": "goworkflows"}],
    )

    # 0004: the backfill fills only what is missing.
    upgrade(db_url, REVISIONS[3])
    attempts = {
        r["id"]: (r["logical_run_id"], r["attempt_id"])
        for r in rows(db_url, "relay_runs", ("id", "logical_run_id", "attempt_id"))
    }
    assert attempts == {"r0": ("r0", 1), "r1": ("logical-1", 2), "r2": ("r2", 1), "r3": ("r3", 1)}
    assert rows(db_url, "relay_runs", RUN_COLUMNS_2) == gen2["relay_runs"]

    # 0005: indexes only.
    upgrade(db_url, REVISIONS[4])
    head = {name: rows(db_url, name) for name in ALL_TABLES}
    assert len(head["relay_node_runtime"]) == 8

    # Down again, one step at a time: every row the older schema can hold stays.
    run_downgrade(db_url, REVISIONS[3])
    assert "relay_runs_sweepable" not in relay_indexes(db_url)
    assert {name: rows(db_url, name) for name in ALL_TABLES} == head

    run_downgrade(db_url, REVISIONS[2])
    assert {name: rows(db_url, name) for name in ALL_TABLES} == head

    # 0003 -> 0002 rebuilds relay_runs on SQLite (batch mode): the children of
    # the rebuilt parent must survive, which they do only with foreign keys off.
    run_downgrade(db_url, REVISIONS[1])
    assert relay_tables(db_url) == {"relay_runs", *CHILD_TABLES}
    assert rows(db_url, "relay_runs") == [
        {name: run[name] for name in RUN_COLUMNS_2} for run in head["relay_runs"]
    ]
    for name in CHILD_TABLES:
        assert rows(db_url, name) == head[name], name
    with connected(db_url) as connection:
        if dialect == "sqlite":
            assert connection.exec_driver_sql("PRAGMA foreign_key_check").all() == []
        for name in CHILD_TABLES:
            (foreign_key,) = sa.inspect(connection).get_foreign_keys(name)
            assert foreign_key["referred_table"] == "relay_runs"
            assert (foreign_key.get("options") or {}).get("ondelete") == "CASCADE"

    run_downgrade(db_url, REVISIONS[0])
    assert relay_tables(db_url) == {"relay_runs"}
    assert rows(db_url, "relay_runs") == [
        {name: run[name] for name in RUN_COLUMNS_1} for run in head["relay_runs"]
    ]

    # And up to head once more: the runs are all there.
    upgrade(db_url)
    assert [r["id"] for r in rows(db_url, "relay_runs")] == ["r0", "r1", "r2", "r3"]
    assert rows(db_url, "relay_runs", RUN_COLUMNS_1) == gen1_runs
    with plain_engine(db_url) as engine:
        assert schema_drift(engine) == []


def test_child_rows_survive_the_downgrade_through_the_public_api(db_url: str) -> None:
    """The same guarantee, with rows written by RunProjection on a foreign-keys-on engine."""
    projection = open_projection(db_url, upgrade=True)
    try:
        projection.insert_start(RunStart("r1", "acme/app", "deliver", "T-1", "ACME-1"), T0)
        projection.update_node("r1", RunState.RUNNING, "build", "v1")
        projection.record_processed_report("r1", "v1", "rep-1")
    finally:
        projection.engine.dispose()

    run_downgrade(db_url, REVISIONS[1])
    assert [r["node"] for r in rows(db_url, "relay_node_runtime")] == ["build"]
    assert [r["report_id"] for r in rows(db_url, "relay_processed_reports")] == ["rep-1"]

    projection = open_projection(db_url, upgrade=True)
    try:
        assert projection.get_run("r1").attempt_id == 1
        assert projection.get_node_runtime("r1", "build").node_visit_id == "v1"
    finally:
        projection.engine.dispose()


# --------------------------------------------------------- unknown revision ---


def _stamp_unknown_revision(target: str) -> None:
    upgrade(target)
    with connected(target) as connection:
        connection.execute(
            sa.text("UPDATE alembic_version SET version_num = :v"), {"v": UNKNOWN_REVISION}
        )


def test_database_from_a_newer_release_is_refused_clearly(db_url: str) -> None:
    _stamp_unknown_revision(db_url)

    with pytest.raises(SchemaOutOfDate) as raised:
        upgrade(db_url)
    assert UNKNOWN_REVISION in str(raised.value)
    assert head_revision() in str(raised.value)
    with pytest.raises(SchemaOutOfDate, match=UNKNOWN_REVISION):
        init_database(db_url)
    with pytest.raises(SchemaOutOfDate, match=UNKNOWN_REVISION):
        open_projection(db_url)
    assert versions(db_url) == [UNKNOWN_REVISION]


def test_command_line_reports_a_newer_release_in_one_line(db_url: str, tmp_path: Path) -> None:
    _stamp_unknown_revision(db_url)

    result = alembic_cli("upgrade", "head", cwd=tmp_path, url=url_of(db_url))

    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    assert UNKNOWN_REVISION in lines[0]
    assert head_revision() in lines[0]
    assert versions(db_url) == [UNKNOWN_REVISION]


# ------------------------------------------------------------ command line ---


def test_x_url_beats_the_environment(db_url: str, tmp_path: Path) -> None:
    loser = tmp_path / "environment.db"
    result = alembic_cli(
        "-x", f"url={url_of(db_url)}", "upgrade", "head", cwd=tmp_path, url=f"sqlite:///{loser}"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert versions(db_url) == [head_revision()]
    assert not loser.exists()
    assert not (tmp_path / "relay-flow.db").exists()


def test_environment_beats_the_default(db_url: str, tmp_path: Path) -> None:
    result = alembic_cli("upgrade", "head", cwd=tmp_path, url=url_of(db_url))
    assert result.returncode == 0, result.stdout + result.stderr
    assert versions(db_url) == [head_revision()]
    assert not (tmp_path / "relay-flow.db").exists()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("command", [["current"], ["check"], ["history", "-i"]])
def test_reading_commands_create_no_file(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    result = alembic_cli("-x", f"url=sqlite:///{missing}", *command, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    assert f"{missing} does not exist" in result.stdout
    assert sorted(tmp_path.iterdir()) == []


def test_upgrade_logs_the_context_once_and_leaves_no_lock_file(db_url: str, tmp_path: Path) -> None:
    result = alembic_cli("upgrade", "head", cwd=tmp_path, url=url_of(db_url))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.count("Context impl") == 1, result.stderr
    current = alembic_cli("current", cwd=tmp_path, url=url_of(db_url))
    assert current.stderr.count("Context impl") == 1, current.stderr
    assert f"{head_revision()} (head)" in current.stdout
    path = resolve_target(db_url).path
    if path is not None:
        assert not Path(f"{path}.migrate-lock").exists()


@pytest.mark.parametrize("command", [["current"], ["check"], ["upgrade", "head"]])
def test_newer_release_says_upgrade_the_package(
    command: list[str], db_url: str, tmp_path: Path
) -> None:
    _stamp_unknown_revision(db_url)
    result = alembic_cli(*command, cwd=tmp_path, url=url_of(db_url))
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert UNKNOWN_REVISION in line
    assert "upgrade the relay-flow-projection package" in line


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@localhost:notaport/db", "the port must be a number"),
        ("nosuchdialect://x/y", "invalid database URL"),
    ],
)
def test_bad_url_is_one_line(url: str, expected: str, tmp_path: Path) -> None:
    result = alembic_cli("-x", f"url={url}", "current", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert expected in line


def test_x_url_beats_the_default(db_url: str, tmp_path: Path) -> None:
    result = alembic_cli("-x", f"url={url_of(db_url)}", "upgrade", "head", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert versions(db_url) == [head_revision()]
    assert not (tmp_path / "relay-flow.db").exists()


@pytest.mark.sqlite_only
def test_default_url_is_relay_flow_db_in_the_working_directory(tmp_path: Path) -> None:
    result = alembic_cli("upgrade", "head", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    default = tmp_path / "relay-flow.db"
    assert default.exists()
    assert versions(str(default)) == [head_revision()]


RELEASED_DDL = Path(__file__).resolve().parent / "data" / "offline_ddl_0.3.0"


def test_the_chain_prints_the_sqlite_ddl_it_was_released_with() -> None:
    """Neither MySQL (0.4.0) nor live upgrades (0.5.0) changed what the revisions do
    on SQLite: `upgrade head --sql` prints 0.3.0's DDL byte for byte. (PostgreSQL's
    and MySQL's printed DDL changed in 0.5.0; tests/test_live_upgrades.py holds the
    schema they build equal to 0.4.0's.)"""
    config = alembic_config("sqlite:///released.db")
    config.output_buffer = io.StringIO()
    command.upgrade(config, "head", sql=True)
    released = (RELEASED_DDL / "sqlite.sql").read_text(encoding="utf-8")
    assert config.output_buffer.getvalue() == released


@pytest.mark.parametrize("reachable", [True, False], ids=["real-schema", "unreachable"])
def test_offline_sql_for_postgresql_touches_no_database(
    reachable: bool, postgres_url: str, tmp_path: Path
) -> None:
    url = postgres_url if reachable else "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"

    result = alembic_cli("upgrade", "head", "--sql", cwd=tmp_path, url=url)

    assert result.returncode == 0, result.stdout + result.stderr
    sql = result.stdout
    assert "CREATE TABLE relay_runs" in sql
    created = sql[sql.index("CREATE TABLE relay_runs") :].split(");", 1)[0]
    assert "started_at TIMESTAMP WITH TIME ZONE NOT NULL" in created
    assert "finished_at TIMESTAMP WITH TIME ZONE" in created
    assert f"'{head_revision()}'" in sql
    assert list(tmp_path.iterdir()) == []
    if reachable:
        with connected(postgres_url) as connection:
            assert sa.inspect(connection).get_table_names() == []


def schema_catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything the schema is made of (the PostgreSQL schema's or MySQL database's
    name left out), and the version row."""
    with connected(url) as connection:
        versions = connection.exec_driver_sql("SELECT version_num FROM alembic_version").all()
        if connection.dialect.name == "sqlite":
            objects = connection.exec_driver_sql(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
            ).all()
            return {"objects": [tuple(row) for row in objects], "versions": list(versions)}
        if connection.dialect.name == "postgresql":
            schema = connection.exec_driver_sql("SELECT current_schema()").scalar_one()
            queries = _POSTGRES_CATALOG
        else:
            schema = connection.exec_driver_sql("SELECT DATABASE()").scalar_one()
            queries = _MYSQL_CATALOG
        catalog = {
            name: [tuple(str(value).replace(f"{schema}.", "") for value in row)
                   for row in connection.exec_driver_sql(query)]
            for name, query in queries.items()
        }  # fmt: skip
        return catalog | {"versions": list(versions)}


_POSTGRES_CATALOG = {
    "columns": """SELECT table_name, ordinal_position, column_name, data_type,
            is_nullable, column_default FROM information_schema.columns
        WHERE table_schema = current_schema() ORDER BY 1, 2""",
    "constraints": """SELECT c.conrelid::regclass::text, c.conname, c.contype,
            pg_get_constraintdef(c.oid), c.convalidated FROM pg_constraint c
        JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = current_schema() ORDER BY 1, 2""",
    "indexes": """SELECT t.relname, c.relname, pg_get_indexdef(i.indexrelid),
            i.indisvalid, i.indisready FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() ORDER BY 1, 2""",
}
_MYSQL_CATALOG = {
    "tables": """SELECT table_name, engine, table_collation FROM information_schema.tables
        WHERE table_schema = DATABASE() ORDER BY 1""",
    "columns": """SELECT table_name, ordinal_position, column_name, column_type, is_nullable,
            column_default, collation_name, extra FROM information_schema.columns
        WHERE table_schema = DATABASE() ORDER BY 1, 2""",
    "indexes": """SELECT table_name, index_name, seq_in_index, column_name, non_unique,
            sub_part FROM information_schema.statistics
        WHERE table_schema = DATABASE() ORDER BY 1, 2, 3""",
    "constraints": """SELECT t.table_name, t.constraint_name, t.constraint_type,
            r.referenced_table_name, r.update_rule, r.delete_rule
        FROM information_schema.table_constraints t
        LEFT JOIN information_schema.referential_constraints r
          ON r.constraint_schema = t.constraint_schema AND r.constraint_name = t.constraint_name
        WHERE t.table_schema = DATABASE() ORDER BY 1, 2""",
    "checks": """SELECT constraint_name, check_clause FROM information_schema.check_constraints
        WHERE constraint_schema = DATABASE() ORDER BY 1""",
}


def test_the_suites_head_databases_equal_the_chain_run_online(
    dialect: str, tmp_path: Path, postgres_schemas: PostgresSchemas
) -> None:
    """conftest's migrated_url copies (SQLite) or replays (PostgreSQL: the printed
    `upgrade head --sql` script) the chain's output; it must be what the chain builds
    online, so the functional suite runs on exactly that schema."""
    if dialect == "postgresql":
        online, replayed = postgres_schemas.new_url(), postgres_schemas.new_url()
        replay_head_ddl(postgres_schemas.schema_of(replayed))
    else:
        online, replayed = str(tmp_path / "online.db"), str(tmp_path / "copied.db")
        copy_head_sqlite(Path(replayed))
    upgrade(online)
    assert schema_catalog(replayed) == schema_catalog(online)
    assert schema_catalog(online)["versions"] == [(head_revision(),)]


def test_alembic_check_is_clean_at_head_only(db_url: str, tmp_path: Path) -> None:
    upgrade(db_url, REVISIONS[3])
    behind = alembic_cli("check", cwd=tmp_path, url=url_of(db_url))
    assert behind.returncode != 0
    assert "Traceback" not in behind.stdout + behind.stderr

    upgrade(db_url)
    result = alembic_cli("check", cwd=tmp_path, url=url_of(db_url))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No new upgrade operations detected" in result.stdout
    # check reads only: the version row is where upgrade left it.
    assert versions(db_url) == [head_revision()]


# ------------------------------------------------------- failing revisions ---


def test_revision_failing_midway_leaves_the_previous_revision_intact(
    db_url: str, dialect: str
) -> None:
    upgrade(db_url, REVISIONS[3])
    insert(db_url, "relay_runs", [run_values(f"r{i}", i, logical_run_id=f"r{i}", attempt_id=1)
                                  for i in range(3)])  # fmt: skip
    before = rows(db_url, "relay_runs")
    # An object in the way of 0005's last index: the revision fails after
    # creating its first four indexes.
    with connected(db_url) as connection:
        connection.execute(sa.text("CREATE INDEX relay_runs_sweepable ON relay_runs (state)"))

    with pytest.raises(ProjectionError, match="relay_runs_sweepable"):
        upgrade(db_url)

    assert versions(db_url) == [REVISIONS[3]]
    assert rows(db_url, "relay_runs") == before
    # On SQLite the revision's earlier steps were rolled back with it. MySQL
    # commits each DDL statement, and PostgreSQL each concurrent index build
    # (live upgrades): there they stay, and the re-run skips them.
    earlier = {
        "relay_runs_list_order",
        "relay_runs_logical_attempts",
        "relay_runs_active_workflow",
        "relay_runs_active_repo",
    }
    assert relay_indexes(db_url) & earlier == (set() if dialect == "sqlite" else earlier)
    with pytest.raises(SchemaOutOfDate):
        open_projection(db_url)

    with connected(db_url) as connection:
        on_table = " ON relay_runs" if dialect == "mysql" else ""
        connection.execute(sa.text(f"DROP INDEX relay_runs_sweepable{on_table}"))
    upgrade(db_url)

    assert versions(db_url) == [head_revision()]
    assert rows(db_url, "relay_runs") == before
    with plain_engine(db_url) as engine:
        assert schema_drift(engine) == []
