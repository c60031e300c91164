"""The operator command line, end to end on SQLite and PostgreSQL.

Most tests drive the click group through ``CliRunner`` on a real database of
the parametrized dialect; a few run the installed console script and
``python -m relay_flow_projection`` as real processes (SQLite).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from conftest import set_versions, skip_or_fail

from relay_flow_projection import (
    DatabaseBusy,
    DatabaseUnavailable,
    ExecutorIdentity,
    IdentityMismatch,
    IdentityMissing,
    InvalidIdentity,
    NodeRuntime,
    NodeRuntimeNotFound,
    NotAProjectionDatabase,
    ProjectionError,
    RetryStatus,
    RunNotFound,
    RunProjection,
    RunStart,
    RunState,
    SchemaOutOfDate,
    create_engine,
    init_database,
    init_database_with_identity,
)
from relay_flow_projection.cli import cli
from relay_flow_projection.cli.durations import parse_duration
from relay_flow_projection.cli.errors import exit_code_for
from relay_flow_projection.migrate import head_revision

ENV_VAR = "RELAY_FLOW_DATABASE_URL"
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
ERROR_PREFIX = "relay-flow-projection: error: "

RUN_KEYS = {
    "id",
    "logical_id",
    "attempt_id",
    "repo",
    "workflow",
    "ticket_id",
    "ticket_key",
    "state",
    "terminal",
    "current_node",
    "current_node_visit_id",
    "last_error",
    "retry",
    "started_at",
    "updated_at",
    "finished_at",
}
NODE_RUNTIME_KEYS = {"node", "node_visit_id", "terminal_id", "session_id", "updated_at"}
IDENTITY_KEYS = {"executor_plugin", "temporal_address", "temporal_namespace"}
REVISION_KEYS = {"database", "revision", "head", "at_head"}
TEMPORAL = ("--executor", "temporal", "--temporal-address", "t:7233", "--temporal-namespace", "ns")


# ------------------------------------------------------------- helpers ---


def invoke(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """Run the CLI in-process; the ambient $RELAY_FLOW_DATABASE_URL never leaks in."""
    environment: dict[str, str | None] = {ENV_VAR: None}
    environment.update(env or {})
    result = CliRunner().invoke(cli, list(args), env=environment)
    # Only SystemExit may end a command: anything else would be a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def ok(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    result = invoke(*args, env=env)
    assert result.exit_code == 0, result.output
    return result


def as_json(*args: str, env: Mapping[str, str | None] | None = None) -> Any:
    return json.loads(ok(*args, "--json", env=env).stdout)


def assert_error(result: Result, exit_code: int, fragment: str) -> None:
    """Exactly one line on stderr, with the exit code of the contract."""
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(ERROR_PREFIX), lines[0]
    assert fragment in lines[0], lines[0]


def at(day: int, hour: int = 0) -> datetime:
    return datetime(2020, 1, day, hour, tzinfo=UTC)


def seed(target: str) -> None:
    """Four runs: two terminal (one finished in 2020, one two hours ago), two active.

    run-a  acme/api build   T-1 completed  finished 2020-01-02
    run-b  acme/api deploy  T-2 canceled   finished two hours ago
    run-c  acme/web build   T-3 running    node compile, visit v1, with a runtime binding
    run-d  acme/web build   T-1 waiting    with a retry status
    """
    engine = create_engine(target)
    try:
        projection = RunProjection(engine, clock=lambda: at(20))
        starts = [
            ("run-a", "acme/api", "build", "T-1", 1),
            ("run-b", "acme/api", "deploy", "T-2", 3),
            ("run-c", "acme/web", "build", "T-3", 4),
            ("run-d", "acme/web", "build", "T-1", 5),
        ]
        for run_id, repo, workflow, ticket, day in starts:
            start = RunStart(run_id, repo, workflow, f"id-{ticket}", ticket)
            projection.insert_start(start, at(day))
        projection.update_state("run-a", RunState.COMPLETED, finished_at=at(2))
        recent = datetime.now(UTC) - timedelta(hours=2)
        projection.update_state("run-b", RunState.CANCELED, "stopped", finished_at=recent)
        projection.update_node("run-c", RunState.RUNNING, "compile", "v1")
        projection.update_node_runtime(NodeRuntime("run-c", "compile", "term-1", "sess-1", "v1"))
        projection.update_state("run-d", RunState.WAITING)
        projection.update_retry("run-d", RetryStatus(2, "boom", at(6, 12)))
    finally:
        engine.dispose()


@pytest.fixture
def seeded_url(migrated_url: str) -> str:
    seed(migrated_url)
    return migrated_url


def run_ids(target: str, *options: str) -> list[str]:
    return [run["id"] for run in as_json("--db", target, "runs", "list", *options)["runs"]]


def add_stray_table(target: str) -> None:
    engine = create_engine(target)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE relay_stray (id INTEGER PRIMARY KEY)"))
    finally:
        engine.dispose()


# ----------------------------------------------------- init / upgrade ---


def test_init_creates_the_schema_at_head_and_is_idempotent(db_url: str) -> None:
    first = ok("--db", db_url, "init")
    assert f"at revision {head_revision()} (head)" in first.stdout
    ok("--db", db_url, "init")
    revision = as_json("--db", db_url, "current")
    assert set(revision) == REVISION_KEYS
    assert revision["revision"] == revision["head"] == head_revision()
    assert revision["at_head"] is True
    assert as_json("--db", db_url, "identity", "show") == {"identity": None}


def test_init_with_temporal_identity_writes_the_marker(db_url: str) -> None:
    result = ok("--db", db_url, "init", *TEMPORAL)
    assert "executor identity: temporal (address 't:7233', namespace 'ns')" in result.stdout
    shown = ok("--db", db_url, "identity", "show").stdout
    assert shown == "temporal (address 't:7233', namespace 'ns')\n"
    shown = as_json("--db", db_url, "identity", "show")["identity"]
    assert set(shown) == IDENTITY_KEYS
    assert shown == {
        "executor_plugin": "temporal",
        "temporal_address": "t:7233",
        "temporal_namespace": "ns",
    }
    # A second init with the same identity verifies it; a different one is a mismatch,
    # with both identities as people write them (no dataclass repr).
    ok("--db", db_url, "init", *TEMPORAL)
    mismatch = invoke("--db", db_url, "init", "--executor", "goworkflows")
    assert_error(
        mismatch,
        1,
        "executor identity mismatch: configured goworkflows, "
        "but the database belongs to temporal (address 't:7233', namespace 'ns')",
    )
    assert "ExecutorIdentity" not in mismatch.stderr
    assert "executor_plugin" not in mismatch.stderr
    other = ("--executor", "temporal", "--temporal-address", "t:7233", "--temporal-namespace", "x")
    assert_error(
        invoke("--db", db_url, "init", *other),
        1,
        "configured temporal (address 't:7233', namespace 'x'), "
        "but the database belongs to temporal (address 't:7233', namespace 'ns')",
    )


def test_init_with_an_invalid_identity_is_bad_input_and_touches_nothing(db_url: str) -> None:
    result = invoke("--db", db_url, "init", "--executor", "temporal", "--temporal-address", "a")
    assert_error(result, 2, "temporal identity requires")
    if "://" not in db_url:
        assert not Path(db_url).exists()
    else:
        assert as_json("--db", db_url, "current")["revision"] is None
    orphan = invoke("--db", db_url, "init", "--temporal-namespace", "ns")
    assert_error(orphan, 2, "need --executor")
    unknown = invoke("--db", db_url, "init", "--executor", "cron")
    assert_error(unknown, 2, "'cron' is not one of")


def test_upgrade_to_a_revision_then_to_head(db_url: str) -> None:
    step = ok("--db", db_url, "upgrade", "+1")
    assert "from (none) to 0001_generation_1 (not at head" in step.stdout
    first = ok("--db", db_url, "upgrade", "0003")
    assert "from 0001_generation_1 to 0003_generation_3 (not at head" in first.stdout
    revision = as_json("--db", db_url, "current")
    assert revision["revision"] == "0003_generation_3"
    assert revision["at_head"] is False
    assert "not at head" in ok("--db", db_url, "current").stdout

    second = ok("--db", db_url, "upgrade")
    assert f"from 0003_generation_3 to {head_revision()} (head)" in second.stdout
    assert "already at" in ok("--db", db_url, "upgrade", "head").stdout
    assert as_json("--db", db_url, "current")["at_head"] is True


def test_upgrade_to_an_unknown_revision_is_a_usage_error(migrated_url: str) -> None:
    assert_error(invoke("--db", migrated_url, "upgrade", "no-such-rev"), 2, "REVISION")


# ----------------------------------------------------- current / check ---


def test_current_of_an_empty_database(db_url: str) -> None:
    result = invoke("--db", db_url, "current", "--json")
    if "://" in db_url:  # an empty PostgreSQL schema: unversioned
        assert result.exit_code == 0
        assert json.loads(result.stdout)["revision"] is None
        assert "not initialized" in ok("--db", db_url, "current").stdout
    else:  # a missing SQLite file is not created by a reading command
        assert_error(result, 3, "does not exist")
        assert not Path(db_url).exists()


def test_check_passes_at_head_without_drift(migrated_url: str) -> None:
    assert "no drift" in ok("--db", migrated_url, "check").stdout
    report = as_json("--db", migrated_url, "check")
    assert set(report) == REVISION_KEYS | {"drift", "ok"}
    assert report["ok"] is True
    assert report["drift"] == []


def test_check_fails_when_not_at_head(db_url: str) -> None:
    ok("--db", db_url, "upgrade", "0004")
    assert_error(invoke("--db", db_url, "check"), 4, "not at head")
    result = invoke("--db", db_url, "check", "--json")
    assert result.exit_code == 4
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert report["revision"] == "0004_adopt_legacy_rows"


def test_check_fails_and_lists_drift(migrated_url: str) -> None:
    add_stray_table(migrated_url)
    result = invoke("--db", migrated_url, "check")
    assert_error(result, 5, "drifts from the models (1 difference)")
    assert "drift: remove_table relay_stray" in result.stdout
    failed = invoke("--db", migrated_url, "check", "--json")
    assert failed.exit_code == 5
    report = json.loads(failed.stdout)
    assert report["ok"] is False
    assert report["at_head"] is True
    assert report["drift"] == ["remove_table relay_stray"]


# -------------------------------------------------------------- status ---


def test_status_of_a_seeded_database(seeded_url: str) -> None:
    status = as_json("--db", seeded_url, "status")
    assert set(status) == REVISION_KEYS | {
        "identity",
        "runs",
        "total_runs",
        "active_runs",
        "oldest_active_run",
    }
    assert status["revision"] == head_revision()
    assert status["identity"] is None
    assert status["runs"] == {
        "starting": 0,
        "running": 1,
        "waiting": 1,
        "blocked": 0,
        "completed": 1,
        "canceling": 0,
        "canceled": 1,
    }
    assert status["total_runs"] == 4
    assert status["active_runs"] == 2
    assert status["oldest_active_run"]["id"] == "run-c"
    assert set(status["oldest_active_run"]) == RUN_KEYS

    text = ok("--db", seeded_url, "status").stdout
    assert "4 (2 active)" in text
    assert "run-c (running, acme/web/build, ticket T-3, started 2020-01-04T00:00:00Z)" in text
    assert re.search(r"^running\s+1$", text, re.MULTILINE)


def test_status_shows_the_identity_and_an_empty_database(migrated_url: str) -> None:
    init_database_with_identity(migrated_url, ExecutorIdentity("goworkflows"))
    status = as_json("--db", migrated_url, "status")
    assert status["identity"] == {
        "executor_plugin": "goworkflows",
        "temporal_address": None,
        "temporal_namespace": None,
    }
    assert status["oldest_active_run"] is None
    assert status["total_runs"] == 0
    assert "executor:       goworkflows" in ok("--db", migrated_url, "status").stdout


def test_status_refuses_a_database_not_at_head(db_url: str) -> None:
    ok("--db", db_url, "upgrade", "0003")
    result = invoke("--db", db_url, "status")
    assert_error(result, 4, "not at head")
    assert "relay-flow-projection upgrade" in result.stderr


# ---------------------------------------------------------------- runs ---


def test_runs_list_filters(seeded_url: str) -> None:
    assert run_ids(seeded_url) == ["run-a", "run-b", "run-c", "run-d"]
    assert run_ids(seeded_url, "--repo", "acme/web") == ["run-c", "run-d"]
    assert run_ids(seeded_url, "--workflow", "deploy") == ["run-b"]
    assert run_ids(seeded_url, "--ticket", "T-1") == ["run-a", "run-d"]
    assert run_ids(seeded_url, "--active") == ["run-c", "run-d"]
    assert run_ids(seeded_url, "--terminal") == ["run-a", "run-b"]
    assert run_ids(seeded_url, "--repo", "acme/web", "--ticket", "T-1") == ["run-d"]
    assert run_ids(seeded_url, "--repo", "nobody") == []


def test_runs_list_pages_with_limit_and_after(seeded_url: str) -> None:
    page = as_json("--db", seeded_url, "runs", "list", "--limit", "2")
    assert set(page) == {"runs", "next_after", "total"}
    assert page["total"] == 4
    assert [run["id"] for run in page["runs"]] == ["run-a", "run-b"]
    assert page["next_after"] == "run-b"
    rest = as_json("--db", seeded_url, "runs", "list", "--limit", "2", "--after", "run-b")
    assert [run["id"] for run in rest["runs"]] == ["run-c", "run-d"]
    last = as_json("--db", seeded_url, "runs", "list", "--limit", "2", "--after", "run-d")
    assert last == {"runs": [], "next_after": None, "total": 4}
    partial = as_json("--db", seeded_url, "runs", "list", "--after", "run-c")
    assert [run["id"] for run in partial["runs"]] == ["run-d"]
    assert partial["next_after"] is None

    text = ok("--db", seeded_url, "runs", "list", "--limit", "2")
    assert "--after run-b" in text.stderr

    assert_error(invoke("--db", seeded_url, "runs", "list", "--after", "ghost"), 3, "'ghost'")
    assert_error(invoke("--db", seeded_url, "runs", "list", "--limit", "0"), 2, "--limit")
    assert_error(invoke("--db", seeded_url, "runs", "list", "--limit", "x"), 2, "--limit")


def test_runs_list_json_shape(seeded_url: str) -> None:
    runs = as_json("--db", seeded_url, "runs", "list")["runs"]
    for run in runs:
        assert set(run) == RUN_KEYS
        assert ISO_UTC.match(run["started_at"])
        assert ISO_UTC.match(run["updated_at"])
    a, b, c, d = runs
    assert a["started_at"] == "2020-01-01T00:00:00.000000Z"
    assert a["finished_at"] == "2020-01-02T00:00:00.000000Z"
    assert a["state"] == "completed"
    assert a["terminal"] is True
    assert a["logical_id"] == "run-a"
    assert a["attempt_id"] == 1
    assert a["ticket_id"] == "id-T-1"
    assert b["last_error"] == "stopped"
    assert c["current_node"] == "compile"
    assert c["current_node_visit_id"] == "v1"
    assert c["terminal"] is False
    assert c["finished_at"] is None
    assert c["retry"] is None
    assert d["retry"] == {
        "attempt": 2,
        "last_error": "boom",
        "next_retry_at": "2020-01-06T12:00:00.000000Z",
    }


def test_runs_list_table_is_aligned(seeded_url: str) -> None:
    lines = ok("--db", seeded_url, "runs", "list").stdout.splitlines()
    header, *rows, count = lines
    assert count == "4 of 4 runs"
    assert header.split() == [
        "ID",
        "STATE",
        "REPO",
        "WORKFLOW",
        "TICKET",
        "ATTEMPT",
        "NODE",
        "STARTED",
        "FINISHED",
    ]
    assert len(rows) == 4
    for column in ("STATE", "REPO", "WORKFLOW", "STARTED", "FINISHED"):
        start = header.index(column)
        for row in rows:
            assert row[start - 1] == " ", (column, row)
            assert row[start] != " ", (column, row)
    assert rows[0].split()[:2] == ["run-a", "completed"]
    assert rows[2].split()[-2:] == ["2020-01-04T00:00:00Z", "-"]


def test_runs_list_empty(migrated_url: str) -> None:
    empty = ok("--db", migrated_url, "runs", "list").stdout.strip()
    assert empty == "no matching runs (0 of 0 runs)"
    expected: dict[str, object] = {"runs": [], "next_after": None, "total": 0}
    assert as_json("--db", migrated_url, "runs", "list") == expected


def test_runs_show_with_node_runtimes(seeded_url: str) -> None:
    shown = as_json("--db", seeded_url, "runs", "show", "run-c")
    assert set(shown) == RUN_KEYS | {"node_runtimes"}
    assert shown["id"] == "run-c"
    assert shown["state"] == "running"
    (runtime,) = shown["node_runtimes"]
    assert set(runtime) == NODE_RUNTIME_KEYS
    assert runtime == {
        "node": "compile",
        "node_visit_id": "v1",
        "terminal_id": "term-1",
        "session_id": "sess-1",
        "updated_at": "2020-01-20T00:00:00.000000Z",
    }
    text = ok("--db", seeded_url, "runs", "show", "run-c").stdout
    assert re.search(r"^current node:\s+compile$", text, re.MULTILINE)
    assert re.search(r"^compile\s+v1\s+term-1\s+sess-1\s+2020-01-20T00:00:00Z$", text, re.MULTILINE)

    retrying = ok("--db", seeded_url, "runs", "show", "run-d").stdout
    assert "attempt 2, next at 2020-01-06T12:00:00Z: boom" in retrying
    assert "no node runtimes" in retrying
    assert as_json("--db", seeded_url, "runs", "show", "run-d")["node_runtimes"] == []


def test_runs_show_of_a_missing_run_exits_3(migrated_url: str) -> None:
    assert_error(invoke("--db", migrated_url, "runs", "show", "ghost"), 3, "run 'ghost' not found")
    result = invoke("--db", migrated_url, "runs", "show", "ghost", "--json")
    assert_error(result, 3, "not found")
    assert result.stdout == ""


# --------------------------------------------------------------- sweep ---


def test_sweep_dry_run_counts_and_deletes_nothing(seeded_url: str) -> None:
    result = ok("--db", seeded_url, "sweep", "--older-than", "30d", "--dry-run")
    assert re.fullmatch(
        r"would sweep 1 run finished before \S+Z \(older than 30d\)\n", result.stdout
    )
    report = as_json("--db", seeded_url, "sweep", "--older-than", "90m", "--dry-run")
    assert set(report) == {"dry_run", "older_than", "cutoff", "runs", "archive", "interrupted"}
    assert report["dry_run"] is True
    assert report["runs"] == 2
    assert report["older_than"] == "90m"
    assert ISO_UTC.match(report["cutoff"])
    assert run_ids(seeded_url) == ["run-a", "run-b", "run-c", "run-d"]


def test_sweep_deletes_old_terminal_runs_only(seeded_url: str) -> None:
    result = ok("--db", seeded_url, "sweep", "--older-than", "12h")
    assert result.stdout.startswith("swept 1 run finished before ")
    assert result.stdout.count("\n") == 1
    assert "sweeping" not in result.stderr  # no progress bar when stderr is not a terminal
    assert run_ids(seeded_url) == ["run-b", "run-c", "run-d"]

    report = as_json("--db", seeded_url, "sweep", "--older-than", "90m", "--batch-size", "1")
    assert report["dry_run"] is False
    assert report["runs"] == 1
    assert run_ids(seeded_url) == ["run-c", "run-d"]
    assert "swept 0 runs" in ok("--db", seeded_url, "sweep", "--older-than", "1m").stdout


def test_sweep_in_batches_removes_child_rows(seeded_url: str) -> None:
    ok("--db", seeded_url, "sweep", "--older-than", "1m", "--batch-size", "1")
    assert run_ids(seeded_url) == ["run-c", "run-d"]
    assert as_json("--db", seeded_url, "runs", "show", "run-c")["node_runtimes"] != []


@pytest.mark.parametrize("text", ["30", "d", "0d", "1.5h", "-3d", "30s", "3 days", ""])
def test_sweep_rejects_bad_durations(migrated_url: str, text: str) -> None:
    result = invoke("--db", migrated_url, "sweep", "--older-than", text)
    assert_error(result, 2, "--older-than")


def test_sweep_needs_older_than_and_a_positive_batch(migrated_url: str) -> None:
    assert_error(invoke("--db", migrated_url, "sweep"), 2, "--older-than")
    bad_batch = invoke("--db", migrated_url, "sweep", "--older-than", "1d", "--batch-size", "0")
    assert_error(bad_batch, 2, "--batch-size")


def test_sweep_of_an_absurd_duration_is_bad_input(migrated_url: str) -> None:
    result = invoke("--db", migrated_url, "sweep", "--older-than", "999999999d")
    assert_error(result, 2, "999999999d")


@pytest.mark.parametrize(
    ("text", "delta"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("7D", timedelta(days=7)),
    ],
)
def test_duration_parsing(text: str, delta: timedelta) -> None:
    assert parse_duration(text).delta == delta


# ------------------------------------------------------------ identity ---


def test_identity_verify(db_url: str) -> None:
    ok("--db", db_url, "init", *TEMPORAL)
    assert "ok: temporal" in ok("--db", db_url, "identity", "verify", *TEMPORAL).stdout
    report = as_json("--db", db_url, "identity", "verify", *TEMPORAL)
    assert set(report) == {"ok", "configured", "persisted"}
    assert report["ok"] is True
    assert report["configured"] == report["persisted"]

    other = (*TEMPORAL[:-1], "other-ns")
    assert_error(invoke("--db", db_url, "identity", "verify", *other), 1, "mismatch")
    failed = invoke("--db", db_url, "identity", "verify", "--executor", "goworkflows", "--json")
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["ok"] is False
    assert_error(failed, 1, "database belongs to temporal")


def test_identity_verify_without_a_marker_never_writes(migrated_url: str) -> None:
    result = ok("--db", migrated_url, "identity", "verify", "--executor", "goworkflows")
    assert "goworkflows adopts this database" in result.stdout
    assert as_json("--db", migrated_url, "identity", "show") == {"identity": None}
    missing = invoke("--db", migrated_url, "identity", "verify", *TEMPORAL)
    assert_error(missing, 3, "no executor identity marker")
    assert (
        "none (no executor identity marker)" in ok("--db", migrated_url, "identity", "show").stdout
    )


def test_identity_verify_rejects_invalid_identities(migrated_url: str) -> None:
    verify = ("--db", migrated_url, "identity", "verify")
    assert_error(invoke(*verify, "--executor", "temporal"), 2, "non-blank")
    assert_error(invoke(*verify, *TEMPORAL[:4], "--executor", "goworkflows"), 2, "goworkflows")
    assert_error(invoke(*verify), 2, "--executor")


# ------------------------------------------- targets, env, usage errors ---


def test_environment_variable_is_the_fallback_target(seeded_url: str, tmp_path: Path) -> None:
    env = {ENV_VAR: seeded_url}
    assert as_json("status", env=env)["total_runs"] == 4
    # --db wins over the environment, before or after the command name.
    missing = str(tmp_path / "elsewhere.db")
    assert_error(invoke("--db", missing, "status", env=env), 3, "does not exist")
    assert_error(invoke("status", "--db", missing, env=env), 3, "does not exist")
    assert as_json("status", "--db", seeded_url, env={ENV_VAR: missing})["total_runs"] == 4


@pytest.mark.sqlite_only
def test_embedded_default_database_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ok("init")
    assert (tmp_path / "relay-flow.db").is_file()
    assert as_json("current")["database"] == "relay-flow.db"
    assert as_json("status", env={ENV_VAR: ""})["total_runs"] == 0


@pytest.mark.sqlite_only
def test_a_file_that_is_not_a_database_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 20)
    for command in (["status"], ["current"], ["init"], ["runs", "list"]):
        assert_error(invoke("--db", str(path), *command), 2, "not a SQLite database")
    assert path.read_text() == "not a database\n" * 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_bad_targets() -> None:
    assert_error(invoke("--db", "nosuch://host/db", "current"), 2, "nosuch")
    assert_error(invoke("--db", "", "current"), 2, "must not be empty")
    assert_error(invoke("current", "--db", " "), 2, "must not be empty")
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2"
    assert_error(invoke("--db", unreachable, "current"), 75, "127.0.0.1")


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (RunNotFound("r"), 3),
        (NodeRuntimeNotFound("n"), 3),
        (IdentityMismatch("m"), 1),
        (IdentityMissing("m"), 3),
        (SchemaOutOfDate("s"), 4),
        (DatabaseUnavailable("u"), 75),
        (DatabaseBusy("b"), 75),
        (ProjectionError("p"), 1),
        (InvalidIdentity("i"), 2),
        (NotAProjectionDatabase("x"), 2),
        (ValueError("v"), 2),
    ],
)
def test_exit_codes_of_library_errors(error: Exception, exit_code: int) -> None:
    assert exit_code_for(error) == exit_code


def test_usage_errors_are_one_line(migrated_url: str) -> None:
    assert_error(invoke("--db", migrated_url, "status", "--bogus"), 2, "No such option")
    assert_error(invoke("--db", migrated_url, "frobnicate"), 2, "No such command")
    assert_error(invoke("--db", migrated_url, "runs", "show"), 2, "ID")
    assert_error(invoke("--db", migrated_url, "runs", "list", "--limit"), 2, "--limit")


def commands() -> dict[str, click.Command]:
    """Every leaf command by its path as typed (``init``, ``runs list``, ...); the
    group imports its commands lazily, so they are asked for, not read from a dict."""
    context = click.Context(cli)
    leaves: dict[str, click.Command] = {}
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            for sub in command.list_commands(context):
                leaf = command.get_command(context, sub)
                assert leaf is not None, sub
                leaves[f"{name} {sub}"] = leaf
        else:
            leaves[name] = command
    return leaves


def command_paths() -> list[str]:
    return sorted(commands())


def test_readme_documents_every_command_with_an_example() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    assert "relay-flow-projection init && relay-flow-projection status" in section
    for path in command_paths():
        assert f"`{path}" in section, path
        assert f"$ relay-flow-projection {path}" in section, path
    for key in sorted(RUN_KEYS | NODE_RUNTIME_KEYS | IDENTITY_KEYS | REVISION_KEYS):
        assert f"`{key}`" in section, key


def test_help_lists_every_command() -> None:
    text = ok("--help").stdout
    commands = ("init", "upgrade", "downgrade", "current", "history", "check", "status", "runs")
    for command in (*commands, "sweep", "identity"):
        assert re.search(rf"^  {command}\s", text, re.MULTILINE), command
    assert ENV_VAR in text


# ------------------------------------------------ real processes (SQLite) ---


def process_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONWARNINGS"] = "error"
    return env


def console_script() -> str:
    script = Path(sys.executable).with_name("relay-flow-projection")
    assert script.exists(), "the console script is installed with the package"
    return str(script)


@pytest.mark.sqlite_only
def test_console_script_end_to_end(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [console_script(), *args],
            cwd=tmp_path,
            env=process_env(),
            capture_output=True,
            text=True,
            check=False,
        )

    init = run("init")
    assert init.returncode == 0, init.stderr
    assert (tmp_path / "relay-flow.db").is_file()
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["revision"] == head_revision()
    missing = run("runs", "show", "ghost")
    assert missing.returncode == 3
    assert missing.stderr == f"{ERROR_PREFIX}run 'ghost' not found\n"
    bad = run("sweep", "--older-than", "soon")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "Traceback" not in bad.stderr


@pytest.mark.sqlite_only
def test_python_dash_m_end_to_end(tmp_path: Path) -> None:
    target = str(tmp_path / "projection.db")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "relay_flow_projection", "--db", target, *args],
            cwd=tmp_path,
            env=process_env(),
            capture_output=True,
            text=True,
            check=False,
        )

    assert run("init", "--executor", "goworkflows").returncode == 0
    shown = run("identity", "show", "--json")
    assert json.loads(shown.stdout)["identity"]["executor_plugin"] == "goworkflows"
    check = run("check")
    assert check.returncode == 0, check.stderr
    mismatch = run("identity", "verify", *TEMPORAL)
    assert mismatch.returncode == 1
    assert mismatch.stderr.startswith(ERROR_PREFIX)
    assert mismatch.stderr.count("\n") == 1


@pytest.mark.sqlite_only
def test_sweep_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    target = str(tmp_path / "projection.db")
    ok("--db", target, "init")
    seed(target)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [console_script(), "--db", target, "sweep", "--older-than", "1m", "--batch-size", "1"],
        stdout=subprocess.PIPE,
        stderr=terminal,
        env=process_env(),
    )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    stdout, _ = process.communicate()
    assert process.returncode == 0
    assert b"sweeping" in shown
    assert b"100%" in shown
    assert stdout.decode().startswith("swept 2 runs finished before ")


# ------------------------------------------- operator items of issue 12 ---


def test_runs_list_hint_and_total_only_when_more_rows_exist(seeded_url: str) -> None:
    exact = ok("--db", seeded_url, "runs", "list", "--limit", "4")
    assert exact.stdout.splitlines()[-1] == "4 of 4 runs"
    assert "more runs follow" not in exact.stderr
    assert as_json("--db", seeded_url, "runs", "list", "--limit", "4")["next_after"] is None
    fewer = ok("--db", seeded_url, "runs", "list", "--limit", "3")
    assert fewer.stdout.splitlines()[-1] == "3 of 4 runs"
    assert fewer.stderr.strip() == "more runs follow: --after run-c"
    web = ok("--db", seeded_url, "runs", "list", "--repo", "acme/web", "--limit", "1")
    assert web.stdout.splitlines()[-1] == "1 of 2 runs"


def test_the_total_line_groups_thousands() -> None:
    from relay_flow_projection.cli.run_commands import _count_text

    assert _count_text(100, 35_700) == "100 of 35,700 runs"
    assert _count_text(1, 1) == "1 of 1 run"


def test_runs_list_state_is_repeatable(seeded_url: str) -> None:
    assert run_ids(seeded_url, "--state", "waiting") == ["run-d"]
    both = ("--state", "completed", "--state", "waiting")
    assert run_ids(seeded_url, *both) == ["run-a", "run-d"]
    assert as_json("--db", seeded_url, "runs", "list", *both)["total"] == 2
    assert run_ids(seeded_url, "--state", "running", "--terminal") == []
    assert run_ids(seeded_url, "--state", "canceled", "--repo", "acme/api") == ["run-b"]
    paged = as_json("--db", seeded_url, "runs", "list", *both, "--limit", "1")
    assert [run["id"] for run in paged["runs"]] == ["run-a"]
    assert paged["next_after"] == "run-a"
    rest = as_json("--db", seeded_url, "runs", "list", *both, "--after", "run-a")
    assert [run["id"] for run in rest["runs"]] == ["run-d"]
    assert_error(invoke("--db", seeded_url, "runs", "list", "--state", "failed"), 2, "--state")


def test_runs_list_all_streams_pages(seeded_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from relay_flow_projection.cli import run_commands

    monkeypatch.setattr(run_commands, "PAGE_SIZE", 2)
    limits: list[int | None] = []
    original = RunProjection.list_runs

    def spy(self: RunProjection, *args: Any, **kwargs: Any) -> list[Any]:
        limits.append(kwargs.get("limit"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RunProjection, "list_runs", spy)
    text = ok("--db", seeded_url, "runs", "list", "--all", "--limit", "1")
    header, *rows, count = text.stdout.splitlines()
    assert header.split()[:2] == ["ID", "STATE"]
    assert [row.split()[0] for row in rows] == ["run-a", "run-b", "run-c", "run-d"]
    # Pages after the first keep the first page's column positions.
    assert {row.index(row.split()[1]) for row in rows} == {header.index("STATE")}
    assert count == "4 of 4 runs"
    assert "more runs follow" not in text.stderr
    # Never more than a page in memory: every query asked for PAGE_SIZE rows.
    assert limits
    assert set(limits) == {2}

    both = invoke("--db", seeded_url, "--json", "runs", "list", "--jsonl")
    assert_error(both, 2, "--json and --jsonl are exclusive")
    jsonl = ok("--db", seeded_url, "runs", "list", "--all", "--jsonl").stdout.splitlines()
    assert [json.loads(line)["id"] for line in jsonl] == ["run-a", "run-b", "run-c", "run-d"]
    assert all(set(json.loads(line)) == RUN_KEYS for line in jsonl)
    first = ok("--db", seeded_url, "runs", "list", "--jsonl", "--limit", "2")
    assert [json.loads(line)["id"] for line in first.stdout.splitlines()] == ["run-a", "run-b"]
    assert first.stderr.strip() == "more runs follow: --after run-b"
    assert_error(invoke("--db", seeded_url, "runs", "list", "--all", "--json"), 2, "--jsonl")


# Every command that prints JSON, with the arguments it needs (a reading command
# or a dry run: each prints the same document however often it runs).
JSON_COMMANDS = {
    "current": [],
    "check": [],
    "history": [],
    "status": [],
    "runs list": [],
    "runs show": ["run-c"],
    "sweep": ["--older-than", "30d", "--dry-run"],
    "identity show": [],
    "identity verify": ["--executor", "goworkflows"],
}


def test_every_json_command_is_listed_here() -> None:
    takes_json = {
        path
        for path, command in commands().items()
        if any(param.name == "as_json" for param in command.params)
    }
    assert takes_json == set(JSON_COMMANDS)
    assert set(command_paths()) - takes_json == {"init", "upgrade", "downgrade"}


@pytest.mark.parametrize("path", sorted(JSON_COMMANDS))
def test_json_and_db_before_or_after_the_command(seeded_url: str, path: str) -> None:
    command = [*path.split(), *JSON_COMMANDS[path]]
    db = [] if path == "history" else ["--db", seeded_url]
    after = json.loads(ok(*command, *db, "--json").stdout)
    before = json.loads(ok("--json", *db, *command).stdout)
    mixed = json.loads(ok("--json", *command, *db).stdout)
    if path == "sweep":  # the cutoff is "now" minus 30 days: it moves between runs
        for report in (after, before, mixed):
            report.pop("cutoff")
    assert after == before == mixed


def test_the_db_after_the_command_wins(seeded_url: str, tmp_path: Path) -> None:
    listed = json.loads(ok("--json", "runs", "list", "--db", seeded_url).stdout)
    assert [run["id"] for run in listed["runs"]] == ["run-a", "run-b", "run-c", "run-d"]
    missing = tmp_path / "missing.db"
    assert_error(invoke("--db", seeded_url, "current", "--db", str(missing)), 3, "does not exist")
    assert ok("--db", str(missing), "current", "--db", seeded_url).exit_code == 0


@pytest.mark.parametrize("command", [["init"], ["upgrade"], ["downgrade", "0004"]])
def test_json_before_a_command_without_json_output_is_refused(
    migrated_url: str, command: list[str]
) -> None:
    result = invoke("--json", "--db", migrated_url, *command)
    assert_error(result, 2, f"`{command[0]}` has no JSON output")
    assert as_json("--db", migrated_url, "current")["at_head"] is True  # nothing ran


def test_upgrade_at_or_below_the_current_revision_exits_1(migrated_url: str) -> None:
    head = head_revision()
    assert_error(
        invoke("--db", migrated_url, "upgrade", "0003"),
        1,
        f"is at {head} (head), past 0003_generation_3; `upgrade` never goes back: "
        "use `relay-flow-projection downgrade 0003_generation_3`",
    )
    assert_error(invoke("--db", migrated_url, "upgrade", head), 1, f"already at {head} (head)")
    assert_error(invoke("--db", migrated_url, "upgrade", "base"), 1, "never goes back")
    assert "already at" in ok("--db", migrated_url, "upgrade").stdout  # head: a no-op deploy
    assert as_json("--db", migrated_url, "current")["revision"] == head


def test_downgrade_and_history(migrated_url: str) -> None:
    head = head_revision()
    step = ok("--db", migrated_url, "downgrade", "0004")
    assert f"from {head} to 0004_adopt_legacy_rows (not at head" in step.stdout
    assert as_json("--db", migrated_url, "current")["revision"] == "0004_adopt_legacy_rows"
    assert_error(
        invoke("--db", migrated_url, "downgrade", head),
        1,
        f"is at 0004_adopt_legacy_rows (not at head {head}), below {head}; "
        f"`downgrade` only goes back: use `relay-flow-projection upgrade {head}`",
    )
    assert_error(
        invoke("--db", migrated_url, "downgrade", "0004"), 1, "already at 0004_adopt_legacy_rows"
    )
    assert_error(invoke("--db", migrated_url, "upgrade", "0004"), 1, "already at 0004")
    assert_error(invoke("--db", migrated_url, "downgrade"), 2, "REVISION")
    # base drops every table: not without --yes (stdin is no terminal here)
    refused = invoke("--db", migrated_url, "downgrade", "base")
    assert_error(refused, 2, "--yes")
    assert "0003_generation_3" in refused.stderr
    assert as_json("--db", migrated_url, "current")["revision"] == "0004_adopt_legacy_rows"
    ok("--db", migrated_url, "downgrade", "base", "--yes")
    assert as_json("--db", migrated_url, "current")["revision"] is None
    assert_error(invoke("--db", migrated_url, "downgrade", "base"), 1, "no revision")
    ok("--db", migrated_url, "upgrade")

    lines = ok("history").stdout.splitlines()
    assert lines[0].startswith(f"0004_adopt_legacy_rows -> {head} (head): ")
    assert lines[-1].startswith("<base> -> 0001_generation_1: ")
    chain = as_json("history")
    assert [entry["head"] for entry in chain] == [True] + [False] * (len(chain) - 1)
    assert chain[-1]["down_revision"] is None


@pytest.mark.parametrize("command", ["status", "current", "check", "runs list"])
def test_a_newer_releases_revision_says_upgrade_the_package(
    migrated_url: str, command: str
) -> None:
    set_versions(migrated_url, "0099_from_the_future")
    result = invoke("--db", migrated_url, *command.split())
    assert_error(result, 4, "0099_from_the_future")
    assert "upgrade the relay-flow-projection package" in result.stderr


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://u@localhost/db?port=notaport",
        "postgresql+psycopg://u@localhost:notaport/db",
    ],
)
def test_a_malformed_url_says_which_part_is_wrong(url: str, tmp_path: Path) -> None:
    for command in (["current"], ["init"], ["upgrade"], ["status"], ["check"]):
        assert_error(invoke("--db", url, *command), 2, "the port must be a number")
    several = "postgresql+psycopg://u@h1,h2/db?port=5432,notaport"
    assert_error(invoke("--db", several, "current"), 2, "got 'notaport' in ?port=")


def test_a_url_sqlalchemy_refuses_is_bad_input_in_its_words() -> None:
    mixed = "postgresql+psycopg://u@localhost/db?host=h1&host=h2&port=5432"
    assert_error(invoke("--db", mixed, "current"), 2, "invalid database URL: Can't mix")


def test_a_missing_driver_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from relay_flow_projection.cli import main; main()\n"
    )
    for command in (["current"], ["init"], ["status"]):
        result = subprocess.run(
            [sys.executable, "-c", code, "--db", "postgresql://postgres@127.0.0.1/x", *command],
            capture_output=True, text=True, env=process_env(), cwd=tmp_path, check=False,
        )  # fmt: skip
        assert result.returncode == 1, result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith(ERROR_PREFIX)
        assert 'install it with pip install "relay-flow-projection[postgresql]"' in line


def test_an_unreachable_server_is_one_line_exit_75() -> None:
    result = invoke("--db", "postgresql+psycopg://postgres@127.0.0.1:1/nothing", "current")
    assert_error(result, 75, "unavailable")


def test_cli_constants_match_the_library() -> None:
    from relay_flow_projection import engine, migration_env
    from relay_flow_projection.cli import options

    assert options.DEFAULT_URL == engine.DEFAULT_URL
    assert options.URL_ENVIRONMENT_VARIABLE == migration_env.URL_ENVIRONMENT_VARIABLE


READ_ONLY_SCRIPT = """
set -e
mount --bind "$1" "$2"
mount -o remount,bind,ro "$2"
shift 2
exec "$@"
"""


def _on_read_only_mount(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with *directory* mounted read-only (a private mount namespace, so
    even root cannot write; the mount vanishes with the process)."""
    view = directory.parent / "read-only-view"
    view.mkdir(exist_ok=True)
    command = ["unshare", "-m", "sh", "-c", READ_ONLY_SCRIPT, "sh", str(directory), str(view)]
    return subprocess.run(
        [*command, sys.executable, "-m", "relay_flow_projection", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=process_env(),
    )


@pytest.mark.sqlite_only
def test_reading_commands_work_on_a_read_only_database(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    database = directory / "relay.db"
    init_database(str(database))
    seed(str(database))
    probe = _on_read_only_mount(directory, "--help")
    skip_or_fail(  # under CI=true a machine that cannot run this fails the run
        None
        if probe.returncode == 0
        else f"cannot mount read-only here (needs CAP_SYS_ADMIN): {probe.stderr.strip()}"
    )
    view = tmp_path / "read-only-view" / "relay.db"
    for command in (["status"], ["current"], ["check"], ["runs", "list"], ["identity", "show"]):
        result = _on_read_only_mount(directory, "--db", str(view), *command)
        assert result.returncode == 0, (command, result.stderr)
    listed = _on_read_only_mount(directory, "--db", str(view), "--json", "runs", "list")
    assert [run["id"] for run in json.loads(listed.stdout)["runs"]] == [
        "run-a", "run-b", "run-c", "run-d",
    ]  # fmt: skip
    for command in (["sweep", "--older-than", "1d"], ["downgrade", "0004"]):
        result = _on_read_only_mount(directory, "--db", str(view), *command)
        assert result.returncode == 1, result.stdout
        assert "the database is read-only" in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1
    assert sorted(p.name for p in directory.iterdir()) == ["relay.db"]


def test_downgrade_takes_a_negative_step_with_or_without_a_double_dash(
    migrated_url: str,
) -> None:
    head = head_revision()
    step = ok("--db", migrated_url, "downgrade", "-1")  # 0005 drops indexes only: no --yes
    assert f"from {head} to 0004_adopt_legacy_rows" in step.stdout
    again = ok("--db", migrated_url, "downgrade", "--", "-1")  # 0004 changes no data
    assert "from 0004_adopt_legacy_rows to 0003_generation_3" in again.stdout
    assert_error(invoke("--db", migrated_url, "downgrade", "-1"), 2, "run again with --yes")
    assert as_json("--db", migrated_url, "current")["revision"] == "0003_generation_3"
    ok("--db", migrated_url, "downgrade", "-1", "--yes")
    assert as_json("--db", migrated_url, "current")["revision"] == "0002_generation_2"
    assert_error(invoke("--db", migrated_url, "downgrade", "-9", "--yes"), 2, "only 2 are applied")
    assert_error(invoke("--db", migrated_url, "downgrade", "+1"), 2, "step up")
    assert_error(invoke("--db", migrated_url, "downgrade", "--bogus"), 2, "No such option")


def test_every_revision_declares_whether_its_downgrade_keeps_data() -> None:
    import ast

    from relay_flow_projection.migrate import migrations_directory

    declared = {}
    for script in sorted((migrations_directory() / "versions").glob("*.py")):
        tree = ast.parse(script.read_text())
        values = [
            node.value.value
            for node in tree.body
            if isinstance(node, ast.AnnAssign | ast.Assign)
            and isinstance(node.value, ast.Constant)
            and any(
                isinstance(t, ast.Name) and t.id == "downgrade_keeps_data"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            )
        ]
        assert len(values) == 1, f"{script.name} must declare downgrade_keeps_data once"
        assert isinstance(values[0], bool), script.name
        declared[script.stem] = values[0]
    assert declared["0001_generation_1"] is False  # drops relay_runs
    assert declared["0003_generation_3"] is False  # drops columns and the identity table
    assert declared["0005_scale_indexes"] is True  # indexes only


@pytest.mark.sqlite_only
def test_a_data_deleting_downgrade_asks_on_a_terminal(tmp_path: Path) -> None:
    target = str(tmp_path / "projection.db")
    ok("--db", target, "init")

    def answer(reply: bytes) -> tuple[int, bytes]:
        controller, terminal = pty.openpty()
        process = subprocess.Popen(
            [console_script(), "--db", target, "downgrade", "base"],
            stdin=terminal, stdout=terminal, stderr=terminal, env=process_env(),
        )  # fmt: skip
        os.close(terminal)
        os.write(controller, reply)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        os.close(controller)
        return process.wait(timeout=60), shown

    code, shown = answer(b"n\n")
    assert code == 2, shown
    assert b"Continue?" in shown
    assert as_json("--db", target, "current")["revision"] == head_revision()
    code, shown = answer(b"y\n")
    assert code == 0, shown
    assert as_json("--db", target, "current")["revision"] is None


def test_a_second_init_says_it_was_already_initialized(db_url: str) -> None:
    assert "initialized" in ok("--db", db_url, "init").stdout
    second = ok("--db", db_url, "init").stdout
    assert "already initialized" in second
    assert not second.startswith("initialized")


def test_current_names_relay_tables_of_an_unknown_shape_as_upgrade_does(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE relay_runs (id INTEGER PRIMARY KEY)"))
    finally:
        engine.dispose()
    current = invoke("--db", db_url, "current")
    assert_error(current, 2, "is not a relay projection (an unknown shape")
    assert "not initialized" not in current.output
    if not db_url.startswith("mysql"):  # MySQL's upgrade fails later, in its DDL (exit 1)
        assert_error(invoke("--db", db_url, "upgrade"), 2, "match no known relay-flow release")
