"""Failed migrations: a revision that fails midway leaves the previous revision and the data.

The failure is injected by the test, in two ways:

- into the real chain, by a class-level ``before_cursor_execute`` listener
  that raises a driver error (disk full / I/O error) at a chosen statement of
  a chosen revision, after earlier statements of that revision have run;
- as an extra revision after head, in a temporary copy of ``migrations/``,
  that adds a column and rewrites rows before it fails.

Then: the version row is still the previous revision, the schema has none of
the failed revision's changes, every row is intact, and running the upgrade
again completes. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
import sqlalchemy as sa
from alembic import command
from reliability_support import PROJECTION_TABLES, snapshot
from sqlalchemy import event
from sqlalchemy.engine import Engine

from relay_flow_projection import ProjectionError, RunProjection, create_engine, upgrade
from relay_flow_projection.migrate import alembic_config, head_revision, migrations_directory

T0 = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
ALEMBIC_INI = Path(__file__).resolve().parents[2] / "alembic.ini"


@contextmanager
def failing_statement(pattern: str, dialect: str) -> Iterator[list[str]]:
    """Make the first statement matching *pattern* fail with a driver error; yield the log."""
    executed: list[str] = []
    failed = False

    def fail(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        nonlocal failed
        executed.append(statement)
        if not failed and re.search(pattern, statement):
            failed = True
            if dialect == "postgresql":
                raise psycopg.errors.DiskFull("could not extend file: No space left (injected)")
            if dialect == "mysql":
                raise pymysql.err.OperationalError(1021, "Disk full (injected)")
            raise sqlite3.OperationalError("disk I/O error (injected)")

    event.listen(Engine, "before_cursor_execute", fail)
    try:
        yield executed
    finally:
        event.remove(Engine, "before_cursor_execute", fail)
    assert failed, f"no statement matched {pattern!r}"


def _alembic_upgrade_head(target: str) -> subprocess.CompletedProcess[str]:
    """The deployer's command, from the repository root, as the README gives it."""
    url = target if "://" in target else f"sqlite:///{target}"
    return subprocess.run(
        [str(Path(sys.executable).with_name("alembic")), "-c", str(ALEMBIC_INI), "upgrade", "head"],
        env={**os.environ, "RELAY_FLOW_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _version(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalars())


def _columns(engine: Engine, table: str) -> list[str]:
    return [column["name"] for column in sa.inspect(engine).get_columns(table)]


def _indexes(engine: Engine) -> set[str]:
    return {str(index["name"]) for index in sa.inspect(engine).get_indexes("relay_runs")}


def _timestamp(dialect: str) -> Any:
    # Go's driver layout on SQLite (what a pre-0004 database holds); a value on PostgreSQL.
    return "2026-03-01 12:00:00.25+00:00" if dialect == "sqlite" else T0


def _seed(engine: Engine, dialect: str, revision: str) -> None:
    """Rows in every table that *revision* has, with the quirks 0004 repairs ('' and 0)."""
    now = _timestamp(dialect)
    inspector = sa.inspect(engine)
    # Untyped columns: values go to the driver as given (Go's text on SQLite).
    tables = {
        name: sa.table(name, *(sa.column(c["name"]) for c in inspector.get_columns(name)))
        for name in inspector.get_table_names()
        if name.startswith("relay_")
    }
    runs = tables["relay_runs"]
    extra: dict[str, Any] = {}
    if "logical_run_id" in runs.c:
        extra = {"logical_run_id": "", "attempt_id": 0}
    with engine.begin() as connection:
        for index in range(3):
            connection.execute(
                runs.insert().values(
                    id=f"run-{index}",
                    repo="repo",
                    workflow="wf",
                    ticket_id=f"T{index}",
                    ticket_key=f"K-{index}",
                    state="running",
                    current_node="plan",
                    current_node_visit_id=f"v{index}",
                    last_error="",
                    started_at=now,
                    updated_at=now,
                    **extra,
                )
            )
            if revision == "0001_generation_1":
                continue
            connection.execute(
                tables["relay_node_runtime"]
                .insert()
                .values(
                    run_id=f"run-{index}",
                    node="plan",
                    terminal_id="",
                    session_id=f"s{index}",
                    node_visit_id=f"v{index}",
                    updated_at=now,
                )
            )
            connection.execute(
                tables["relay_processed_reports"]
                .insert()
                .values(run_id=f"run-{index}", report_id="r", node_visit_id="v", created_at=now)
            )
            connection.execute(
                tables["relay_node_sessions"]
                .insert()
                .values(
                    run_id=f"run-{index}",
                    node="plan",
                    session_id=f"s{index}",
                    node_visit_id=f"v{index}",
                    created_at=now,
                )
            )


def _database_at(db_url: str, dialect: str, revision: str) -> Engine:
    upgrade(db_url, revision)
    engine = create_engine(db_url)
    _seed(engine, dialect, revision)
    return engine


def _rows_by_key(state: dict[str, Any]) -> dict[tuple[str, Any], tuple[Any, ...]]:
    """Every row of every projection table, keyed by (table, row's leading key columns)."""
    keys = {
        "relay_executor_identity": 1,
        "relay_runs": 1,
        "relay_node_runtime": 2,
        "relay_processed_reports": 2,
        "relay_node_sessions": 3,
    }
    return {
        (table, row[: keys[table]]): row
        for table in PROJECTION_TABLES
        for row in state.get(table, [])
    }


CHAIN_FAILURES = [
    # revision that fails, the revision before it, the statement that fails,
    # and a statement of the same revision that must have run before it.
    pytest.param(
        "0002_generation_2",
        "0001_generation_1",
        r"CREATE TABLE relay_node_sessions",
        r"CREATE TABLE relay_processed_reports",
        id="0002-third-table",
    ),
    pytest.param(
        "0003_generation_3",
        "0002_generation_2",
        r"CREATE TABLE relay_executor_identity",
        r"ADD COLUMN attempt_id",
        id="0003-after-add-column",
    ),
    pytest.param(
        "0005_scale_indexes",
        "0004_adopt_legacy_rows",
        r"CREATE INDEX (CONCURRENTLY )?relay_runs_active_repo",
        r"CREATE INDEX (CONCURRENTLY )?relay_runs_logical_attempts",
        id="0005-third-index",
    ),
]


@pytest.mark.parametrize(("failing", "previous", "fail_at", "ran_before"), CHAIN_FAILURES)
def test_revision_failing_midway_keeps_previous_revision(
    db_url: str, dialect: str, failing: str, previous: str, fail_at: str, ran_before: str
) -> None:
    engine = _database_at(db_url, dialect, previous)
    try:
        before = snapshot(engine)
        indexes_before = _indexes(engine)
        with (
            failing_statement(fail_at, dialect) as executed,
            pytest.raises(ProjectionError) as failure,
        ):
            upgrade(db_url)
        assert any(re.search(ran_before, statement) for statement in executed)
        assert "(injected)" in str(failure.value)
        assert str(failure.value).startswith("cannot upgrade")
        engine.dispose()  # forget cached schema and pooled connections

        assert _version(engine) == [previous]
        if dialect == "mysql":
            # MySQL commits each DDL statement: what ran before the failure stays
            # and the re-run finds those steps done (frozen_v1)
            # (the rows too: each as before, beside the columns added since)
            now, then = _rows_by_key(snapshot(engine)), _rows_by_key(before)
            assert {key: now[key][: len(row)] for key, row in then.items()} == then
        else:
            assert snapshot(engine) == before  # same tables, columns' rows, version row
            if dialect == "postgresql" and failing == "0005_scale_indexes":
                # Each concurrent build commits on its own (live upgrades): the
                # ones before the failure stay, and the re-run skips them.
                assert _indexes(engine) > indexes_before
            else:
                assert _indexes(engine) == indexes_before

        # Running `alembic upgrade head` again completes.
        rerun = _alembic_upgrade_head(db_url)
        assert rerun.returncode == 0, rerun.stderr
        assert _version(engine) == [head_revision()]
        runs = RunProjection(engine).list_runs()
        assert [run.id for run in runs] == ["run-0", "run-1", "run-2"]
        assert all(run.last_error is None and run.attempt_id == 1 for run in runs)
        command.check(alembic_config(db_url))  # the schema is head's, exactly
        print(
            f"\nfailed migration[{dialect}]: {failing} failed at /{fail_at}/ after "
            f"{len(executed)} statements; stayed at {previous} with "
            f"{len(_rows_by_key(before))} rows intact; `alembic upgrade head` then reached head"
        )
    finally:
        engine.dispose()


# Transactional DDL: MySQL's revisions are re-run instead (tests/test_killed_upgrades.py),
# and 0004 has nothing to adopt there.
TRANSACTIONAL_DDL = pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])


@TRANSACTIONAL_DDL
def test_batched_adoption_failing_midway_resumes(db_url: str, dialect: str, tmp_path: Path) -> None:
    """0004 repairs rows in autocommit batches: a failure between them keeps the version
    at 0003, loses no row (each row is as before or already repaired), and the re-run
    ends exactly where an uninterrupted upgrade of the same data ends."""
    previous = "0003_generation_3"
    control_url = str(tmp_path / "control.db") if dialect == "sqlite" else None
    engine = _database_at(db_url, dialect, previous)
    try:
        before = _rows_by_key(snapshot(engine))
        with (
            failing_statement(r"UPDATE relay_node_runtime", dialect),
            pytest.raises(ProjectionError),
        ):
            upgrade(db_url)
        engine.dispose()
        assert _version(engine) == [previous]
        interrupted = _rows_by_key(snapshot(engine))
        assert interrupted.keys() == before.keys()

        upgrade(db_url)
        assert _version(engine) == [head_revision()]
        after = _rows_by_key(snapshot(engine))
        assert after.keys() == before.keys()
        for key, row in interrupted.items():
            assert row in (before[key], after[key]), key
        repaired = sum(1 for key, row in interrupted.items() if row != before[key])

        if control_url is not None:  # the same data, upgraded without a failure
            control = _database_at(control_url, dialect, previous)
            upgrade(control_url)
            assert _rows_by_key(snapshot(control)) == after
            control.dispose()
        print(
            f"\nfailed migration[{dialect}]: 0004 failed between batches with "
            f"{repaired} of {len(before)} rows already repaired, none lost; re-run reached head"
        )
    finally:
        engine.dispose()


FAILING_REVISION = '''
    """A revision that changes schema and data, then fails (reliability test).

    Revision ID: 0099_fails_midway
    Revises: {head}
    """
    import os

    import sqlalchemy as sa
    from alembic import op

    revision = "0099_fails_midway"
    down_revision = "{head}"
    branch_labels = None
    depends_on = None


    def upgrade() -> None:
        op.add_column("relay_runs", sa.Column("probe", sa.Text(), nullable=True))
        op.execute("UPDATE relay_runs SET probe = 'x', repo = 'rewritten'")
        op.execute("DELETE FROM relay_processed_reports")
        if os.environ.get("RELIABILITY_FAIL_PROBE") == "1":
            raise RuntimeError("0099_fails_midway fails (injected)")


    def downgrade() -> None:
        with op.batch_alter_table("relay_runs") as batch:
            batch.drop_column("probe")
'''


@TRANSACTIONAL_DDL
def test_new_revision_failing_midway_rolls_back_schema_and_data(
    db_url: str, dialect: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = head_revision()
    engine = _database_at(db_url, dialect, head)
    scripts = tmp_path / "migrations"
    shutil.copytree(migrations_directory(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0099_fails_midway.py").write_text(
        textwrap.dedent(FAILING_REVISION.format(head=head)), encoding="utf-8"
    )
    config = alembic_config(db_url)
    config.set_main_option("script_location", str(scripts))
    try:
        before = snapshot(engine)
        monkeypatch.setenv("RELIABILITY_FAIL_PROBE", "1")
        with pytest.raises(RuntimeError, match="injected"):
            command.upgrade(config, "head")
        engine.dispose()
        assert _version(engine) == [head]
        assert "probe" not in _columns(engine, "relay_runs")
        assert snapshot(engine) == before

        monkeypatch.delenv("RELIABILITY_FAIL_PROBE")
        command.upgrade(config, "head")
        engine.dispose()
        assert _version(engine) == ["0099_fails_midway"]
        assert "probe" in _columns(engine, "relay_runs")
        print(
            f"\nfailed migration[{dialect}]: a new revision that altered relay_runs, rewrote "
            f"3 runs and deleted 3 receipts failed; all of it rolled back; re-run completed"
        )
    finally:
        engine.dispose()
