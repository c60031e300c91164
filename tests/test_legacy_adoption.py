"""Adopting the unversioned SQLite databases relay-flow's Go releases left behind (LEGACY.md).

Each generation (1, 2 fresh, 2 grown from 1, 3 fresh, 3 grown) is built here
with the Go releases' own DDL and Go's timestamp text, with the dirt found in
the wild (orphaned child rows, half-done backfills, '' for NULL, mixed zone
offsets, nanoseconds), then taken to head by ``upgrade(path)``.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.util import CommandError
from legacy_databases import (
    create_schema,
    go_timestamp,
    insert_rows,
    schema_drift,
    sqlite_dump,
    stored_versions,
)

from relay_flow_projection import (
    ExecutorIdentity,
    NotAProjectionDatabase,
    RetryStatus,
    Run,
    RunFilter,
    RunProjection,
    RunState,
    create_engine,
    init_database,
    open_projection,
    upgrade,
)
from relay_flow_projection.migrate import alembic_config, head_revision

pytestmark = pytest.mark.sqlite_only

MIGRATION_LOGGER = "relay_flow_projection.migrations"
REVISION = {1: "0001_generation_1", 2: "0002_generation_2", 3: "0003_generation_3"}
SHAPE_IDS = {
    (1, False): "gen1",
    (2, False): "gen2-fresh",
    (2, True): "gen2-grown",
    (3, False): "gen3-fresh",
    (3, True): "gen3-grown",
}
SHAPES = [pytest.param(*shape, id=name) for shape, name in SHAPE_IDS.items()]


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


# Timestamps exactly as Go's driver wrote them: nanoseconds, trimmed fractions,
# no fraction, and offsets other than +00:00. Raw text order differs from time
# order (run-ist sorts last as text but is third in time; run-mst sorts first).
RUN_ROWS: list[dict[str, Any]] = [
    {
        "id": "run-ist",
        "repo": "acme/app",
        "workflow": "deliver",
        "ticket_id": "T-1",
        "ticket_key": "ACME-1",
        "state": "running",
        "current_node": "build",
        "current_node_visit_id": "v1",
        "last_error": "",
        "started_at": "2026-03-01 09:30:00.25+05:30",
        "updated_at": "2026-03-01 09:31:00.000000001+05:30",
        "finished_at": None,
    },
    {
        "id": "run-ns",
        "repo": "acme/app",
        "workflow": "review",
        "ticket_id": "T-2",
        "ticket_key": "ACME-2",
        "state": "waiting",
        "current_node": "",
        "current_node_visit_id": "",
        "last_error": "boom",
        "started_at": "2026-03-01 03:59:59.123456789+00:00",
        "updated_at": "2026-03-01 03:59:59.987654321+00:00",
        "finished_at": None,
    },
    {
        "id": "run-mst",
        "repo": "acme/lib",
        "workflow": "deliver",
        "ticket_id": "T-3",
        "ticket_key": "ACME-1",
        "state": "completed",
        "current_node": None,
        "current_node_visit_id": None,
        "last_error": "",
        "started_at": "2026-02-28 21:00:00-07:00",
        "updated_at": "2026-02-28 21:00:01.5-07:00",
        "finished_at": "2026-02-28 21:20:00.000001-07:00",
    },
    {
        "id": "run-utc",
        "repo": "acme/lib",
        "workflow": "review",
        "ticket_id": "T-4",
        "ticket_key": "ACME-4",
        "state": "canceled",
        "current_node": "review",
        "current_node_visit_id": "v7",
        "last_error": "canceled by user",
        "started_at": "2026-03-01 04:00:00.999999999+00:00",
        "updated_at": "2026-03-01 09:40:00+05:30",
        "finished_at": "2026-03-01 09:40:00+05:30",
    },
]
CHRONOLOGICAL = ["run-ns", "run-mst", "run-ist", "run-utc"]

RETRY_COLUMNS: dict[str, dict[str, Any]] = {
    "run-ist": {
        "retry_error": "flaky",
        "retry_attempt": 2,
        "next_retry_at": "2026-03-01 09:35:00.5+05:30",
    },
    "run-ns": {"retry_error": None, "retry_attempt": None, "next_retry_at": None},
    "run-mst": {"retry_error": None, "retry_attempt": None, "next_retry_at": None},
    "run-utc": {"retry_error": None, "retry_attempt": None, "next_retry_at": None},
}
# A half-done Go backfill: '' / NULL / 0 on some rows, real values on others.
ATTEMPT_COLUMNS: dict[str, dict[str, Any]] = {
    "run-ist": {"logical_run_id": "", "attempt_id": 0},
    "run-ns": {"logical_run_id": None, "attempt_id": None},
    "run-mst": {"logical_run_id": "logical-x", "attempt_id": 2},
    "run-utc": {"logical_run_id": "logical-x", "attempt_id": 3},
}

NODE_RUNTIME_ROWS: list[dict[str, Any]] = [
    {
        "run_id": "run-ist",
        "node": "build",
        "terminal_id": "",
        "session_id": "sess-1",
        "node_visit_id": "v1",
        "updated_at": "2026-03-01 09:31:00.5+05:30",
    },
    {
        "run_id": "run-ns",
        "node": "test",
        "terminal_id": "term-2",
        "session_id": "",
        "node_visit_id": "v2",
        "updated_at": "2026-03-01 03:59:59.987654321+00:00",
    },
]
PROCESSED_REPORT_ROWS: list[dict[str, Any]] = [
    {
        "run_id": "run-ist",
        "report_id": "rep-1",
        "node_visit_id": "v1",
        "created_at": "2026-03-01 09:31:00+05:30",
    },
    {
        "run_id": "run-mst",
        "report_id": "rep-2",
        "node_visit_id": "v3",
        "created_at": "2026-02-28 21:10:00.1-07:00",
    },
]
NODE_SESSION_ROWS: list[dict[str, Any]] = [
    {
        "run_id": "run-ist",
        "node": "build",
        "session_id": "sess-1",
        "node_visit_id": "v1",
        "created_at": "2026-03-01 09:30:30.000000009+05:30",
    },
]
# Child rows whose run was deleted while the Go driver ran without foreign keys.
ORPHANS: dict[str, list[dict[str, Any]]] = {
    "relay_node_runtime": [
        {
            "run_id": "gone-1",
            "node": "build",
            "terminal_id": None,
            "session_id": None,
            "node_visit_id": "v9",
            "updated_at": "2026-02-01 00:00:00+00:00",
        }
    ],
    "relay_processed_reports": [
        {
            "run_id": "gone-1",
            "report_id": "rep-9",
            "node_visit_id": "v9",
            "created_at": "2026-02-01 00:00:00+00:00",
        },
        {
            "run_id": "gone-2",
            "report_id": "rep-8",
            "node_visit_id": "v8",
            "created_at": "2026-02-01 00:00:00.5+00:00",
        },
    ],
    "relay_node_sessions": [
        {
            "run_id": "gone-2",
            "node": "build",
            "session_id": "sess-x",
            "node_visit_id": "v8",
            "created_at": "2026-02-01 00:00:00+00:00",
        }
    ],
}
CHILDREN: dict[str, list[dict[str, Any]]] = {
    "relay_node_runtime": NODE_RUNTIME_ROWS,
    "relay_processed_reports": PROCESSED_REPORT_ROWS,
    "relay_node_sessions": NODE_SESSION_ROWS,
}
CHILD_KEYS = {
    "relay_node_runtime": ("run_id", "node"),
    "relay_processed_reports": ("run_id", "report_id"),
    "relay_node_sessions": ("run_id", "node", "session_id"),
}

# A table of the workflow engine living in the same file: never ours to touch.
FOREIGN_TABLE = """
CREATE TABLE workflow_history (
    id INTEGER PRIMARY KEY,
    workflow_id TEXT NOT NULL,
    event TEXT,
    recorded_at DATETIME NOT NULL
);
CREATE INDEX workflow_history_workflow ON workflow_history (workflow_id);
"""
FOREIGN_ROWS: list[dict[str, Any]] = [
    {"id": 1, "workflow_id": "wf-1", "event": "", "recorded_at": "2026-03-01 09:30:00.25+05:30"},
    {
        "id": 2,
        "workflow_id": "wf-1",
        "event": None,
        "recorded_at": "2026-03-01 03:59:59.123456789+00:00",
    },
]


def expected_runs(generation: int) -> dict[str, Run]:
    """The runs as the adopted database must return them (UTC, microseconds, backfilled)."""
    retry = (
        RetryStatus(attempt=2, last_error="flaky", next_retry_at=utc(2026, 3, 1, 4, 5, 0, 500_000))
        if generation >= 2
        else None
    )
    logical_mst, attempt_mst = ("logical-x", 2) if generation >= 3 else ("run-mst", 1)
    logical_utc, attempt_utc = ("logical-x", 3) if generation >= 3 else ("run-utc", 1)
    runs = [
        Run(
            "run-ist", "run-ist", 1, "acme/app", "deliver", "T-1", "ACME-1", RunState.RUNNING,
            "build", "v1", None, retry,
            utc(2026, 3, 1, 4, 0, 0, 250_000), utc(2026, 3, 1, 4, 1, 0), None,
        ),
        Run(
            "run-ns", "run-ns", 1, "acme/app", "review", "T-2", "ACME-2", RunState.WAITING,
            None, None, "boom", None,
            utc(2026, 3, 1, 3, 59, 59, 123_456), utc(2026, 3, 1, 3, 59, 59, 987_654), None,
        ),
        Run(
            "run-mst", logical_mst, attempt_mst, "acme/lib", "deliver", "T-3", "ACME-1",
            RunState.COMPLETED, None, None, None, None,
            utc(2026, 3, 1, 4, 0, 0), utc(2026, 3, 1, 4, 0, 1, 500_000),
            utc(2026, 3, 1, 4, 20, 0, 1),
        ),
        Run(
            "run-utc", logical_utc, attempt_utc, "acme/lib", "review", "T-4", "ACME-4",
            RunState.CANCELED, "review", "v7", "canceled by user", None,
            utc(2026, 3, 1, 4, 0, 0, 999_999), utc(2026, 3, 1, 4, 10), utc(2026, 3, 1, 4, 10),
        ),
    ]  # fmt: skip
    return {run.id: run for run in runs}


@dataclass(frozen=True)
class Legacy:
    path: Path
    generation: int
    grown: bool


def build_legacy(
    path: Path, generation: int, grown: bool, identity: dict[str, Any] | None = None
) -> Legacy:
    create_schema(path, generation, grown=grown)
    connection = sqlite3.connect(path)
    try:
        connection.executescript(FOREIGN_TABLE)
    finally:
        connection.close()
    insert_rows(path, "workflow_history", FOREIGN_ROWS)
    rows = []
    for row in RUN_ROWS:
        full = dict(row)
        if generation >= 2:
            full.update(RETRY_COLUMNS[row["id"]])
        if generation >= 3:
            full.update(ATTEMPT_COLUMNS[row["id"]])
        rows.append(full)
    insert_rows(path, "relay_runs", rows)
    if generation >= 2:
        for table, children in CHILDREN.items():
            insert_rows(path, table, [*children, *ORPHANS[table]])
    if generation >= 3 and identity is not None:
        insert_rows(path, "relay_executor_identity", [{"singleton": 1, **identity}])
    return Legacy(path, generation, grown)


def raw(path: Path, query: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(path)
    try:
        return [tuple(row) for row in connection.execute(query)]
    finally:
        connection.close()


def foreign_content(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    schema = raw(
        path,
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE tbl_name = 'workflow_history' ORDER BY name",
    )
    return schema, raw(path, "SELECT * FROM workflow_history ORDER BY id")


def relay_content(path: Path) -> list[str]:
    return [line for line in sqlite_dump(path) if "relay_" in line]


def drift(path: Path) -> list[Any]:
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        return schema_drift(engine)
    finally:
        engine.dispose()


@pytest.fixture(params=list(SHAPE_IDS), ids=list(SHAPE_IDS.values()))
def legacy(request: pytest.FixtureRequest, tmp_path: Path) -> Legacy:
    generation, grown = request.param
    return build_legacy(tmp_path / "relay.db", generation, grown)


@dataclass(frozen=True)
class Adopted:
    legacy: Legacy
    messages: list[str]
    foreign_before: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]


@pytest.fixture
def adopted(legacy: Legacy, caplog: pytest.LogCaptureFixture) -> Adopted:
    foreign_before = foreign_content(legacy.path)
    caplog.set_level(logging.INFO, logger=MIGRATION_LOGGER)
    upgrade(legacy.path)
    messages = [r.getMessage() for r in caplog.records if r.name == MIGRATION_LOGGER]
    return Adopted(legacy, messages, foreign_before)


@pytest.fixture
def adopted_projection(adopted: Adopted) -> Iterator[RunProjection]:
    projection = open_projection(adopted.legacy.path)
    yield projection
    projection.engine.dispose()


# ------------------------------------------------------------------ stamping ---


@pytest.mark.parametrize(("generation", "grown"), SHAPES)
def test_adoption_stamps_the_matching_generation_not_head(
    tmp_path: Path, generation: int, grown: bool, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = build_legacy(tmp_path / "relay.db", generation, grown)
    before = relay_content(legacy.path)
    caplog.set_level(logging.INFO, logger=MIGRATION_LOGGER)

    upgrade(legacy.path, REVISION[generation])

    # The stamp was committed: a brand-new connection sees it.
    assert stored_versions(legacy.path) == [REVISION[generation]]
    # Stamping runs no revision: the relay tables are exactly as Go left them.
    assert [line for line in relay_content(legacy.path) if "alembic" not in line] == before
    stamp_messages = [
        r.getMessage()
        for r in caplog.records
        if r.name == MIGRATION_LOGGER and "stamping" in r.getMessage()
    ]
    assert stamp_messages == [
        f"adopting an unversioned relay-flow database: stamping {REVISION[generation]}"
    ]


def test_generation_1_partial_upgrade_runs_only_the_missing_revisions(tmp_path: Path) -> None:
    legacy = build_legacy(tmp_path / "relay.db", 1, False)

    upgrade(legacy.path, "0003_generation_3")

    assert stored_versions(legacy.path) == ["0003_generation_3"]
    columns = [row[1] for row in raw(legacy.path, "PRAGMA table_info(relay_runs)")]
    assert columns[-5:] == [
        "retry_error",
        "retry_attempt",
        "next_retry_at",
        "logical_run_id",
        "attempt_id",
    ]
    assert raw(legacy.path, "SELECT count(*) FROM relay_runs") == [(len(RUN_ROWS),)]
    # 0004 (the row repairs) has not run yet: the Go text is still there.
    assert ("2026-03-01 09:30:00.25+05:30",) in raw(
        legacy.path, "SELECT started_at FROM relay_runs"
    )


def test_adoption_reaches_head_with_one_stamp(adopted: Adopted) -> None:
    generation = adopted.legacy.generation
    assert stored_versions(adopted.legacy.path) == [head_revision()]
    assert [m for m in adopted.messages if "stamping" in m] == [
        f"adopting an unversioned relay-flow database: stamping {REVISION[generation]}"
    ]


# -------------------------------------------------------------------- values ---


def test_every_run_reads_back_converted(
    adopted: Adopted, adopted_projection: RunProjection
) -> None:
    expected = expected_runs(adopted.legacy.generation)
    for run_id, run in expected.items():
        got = adopted_projection.get_run(run_id)
        assert got == run
        for stamp in (got.started_at, got.updated_at, got.finished_at):
            assert stamp is None or stamp.tzinfo is UTC
    assert adopted_projection.count_runs() == {
        RunState.RUNNING: 1,
        RunState.WAITING: 1,
        RunState.COMPLETED: 1,
        RunState.CANCELED: 1,
    }


def test_backfill_and_empty_strings_are_repaired_in_storage(adopted: Adopted) -> None:
    rows = {
        row[0]: row[1:]
        for row in raw(
            adopted.legacy.path,
            "SELECT id, logical_run_id, attempt_id, current_node, current_node_visit_id, "
            "last_error FROM relay_runs",
        )
    }
    third = adopted.legacy.generation >= 3
    assert rows == {
        "run-ist": ("run-ist", 1, "build", "v1", None),
        "run-ns": ("run-ns", 1, None, None, "boom"),
        "run-mst": ("logical-x" if third else "run-mst", 2 if third else 1, None, None, None),
        "run-utc": ("logical-x" if third else "run-utc", 3 if third else 1, "review", "v7",
                    "canceled by user"),
    }  # fmt: skip


def test_stored_timestamps_are_canonical_and_sort_in_time_order(
    adopted: Adopted, adopted_projection: RunProjection
) -> None:
    path = adopted.legacy.path
    started = raw(path, "SELECT id, started_at, updated_at, finished_at FROM relay_runs")
    assert sorted(started) == [
        ("run-ist", "2026-03-01 04:00:00.250000+00:00", "2026-03-01 04:01:00.000000+00:00", None),
        ("run-mst", "2026-03-01 04:00:00.000000+00:00", "2026-03-01 04:00:01.500000+00:00",
         "2026-03-01 04:20:00.000001+00:00"),
        ("run-ns", "2026-03-01 03:59:59.123456+00:00", "2026-03-01 03:59:59.987654+00:00", None),
        ("run-utc", "2026-03-01 04:00:00.999999+00:00", "2026-03-01 04:10:00.000000+00:00",
         "2026-03-01 04:10:00.000000+00:00"),
    ]  # fmt: skip
    # Text order is time order again, in SQL and through the API.
    assert [r[0] for r in raw(path, "SELECT id FROM relay_runs ORDER BY started_at")] == (
        CHRONOLOGICAL
    )
    assert [run.id for run in adopted_projection.list_runs()] == CHRONOLOGICAL
    page = adopted_projection.list_runs(limit=2)
    rest = adopted_projection.list_runs(after=page[-1])
    assert [run.id for run in page + rest] == CHRONOLOGICAL
    # finished_at < ? compares text: run-utc finished at 04:10 UTC (written as
    # 09:40+05:30), run-mst at 04:20 UTC (written as 21:20-07:00 the day before).
    assert adopted_projection.count_sweepable(utc(2026, 3, 1, 4, 15)) == 1
    # The latest attempt of a logical run is found by time, not by text.
    assert adopted_projection.find_run_by_ticket("ACME-1").id == "run-ist"
    if adopted.legacy.generation >= 3:
        assert adopted_projection.find_run_by_logical_id("logical-x").id == "run-utc"
    if adopted.legacy.generation >= 2:
        children = [
            ("relay_node_runtime", "updated_at"),
            ("relay_processed_reports", "created_at"),
            ("relay_node_sessions", "created_at"),
        ]
        for table, column in children:
            for (value,) in raw(path, f"SELECT {column} FROM {table}"):
                assert len(value) == len("2026-03-01 04:00:00.000000+00:00")
                assert value.endswith("+00:00")
        assert raw(path, "SELECT next_retry_at FROM relay_runs WHERE id = 'run-ist'") == [
            ("2026-03-01 04:05:00.500000+00:00",)
        ]


def test_adopted_database_filters_by_active_and_workflow(
    adopted: Adopted, adopted_projection: RunProjection
) -> None:
    active = adopted_projection.list_runs(RunFilter(active=True))
    assert [run.id for run in active] == ["run-ns", "run-ist"]
    assert adopted_projection.has_active_workflow("deliver")
    assert not adopted_projection.has_active_repo("acme/lib")
    terminal = adopted_projection.list_runs(RunFilter(active=False, workflow="review"))
    assert [run.id for run in terminal] == ["run-utc"]


# ------------------------------------------------------------- child rows ---


def test_orphans_are_removed_and_counted_in_the_log(adopted: Adopted) -> None:
    path = adopted.legacy.path
    if adopted.legacy.generation == 1:
        assert not [m for m in adopted.messages if "orphaned" in m]
        return
    assert sorted(m for m in adopted.messages if "orphaned" in m) == [
        "removed 1 orphaned rows from relay_node_runtime",
        "removed 1 orphaned rows from relay_node_sessions",
        "removed 2 orphaned rows from relay_processed_reports",
    ]
    assert raw(path, "PRAGMA foreign_key_check") == []
    for table in CHILDREN:
        assert not raw(path, f"SELECT * FROM {table} WHERE run_id LIKE 'gone-%'")


def test_child_rows_of_existing_runs_all_survive(
    adopted: Adopted, adopted_projection: RunProjection
) -> None:
    if adopted.legacy.generation == 1:
        return
    path = adopted.legacy.path
    for table, rows in CHILDREN.items():
        keys = CHILD_KEYS[table]
        stored = raw(path, f"SELECT {', '.join(keys)} FROM {table} ORDER BY 1, 2")
        assert stored == sorted(tuple(row[key] for key in keys) for row in rows), table
    build = adopted_projection.get_node_runtime("run-ist", "build")
    assert (build.terminal_id, build.session_id, build.node_visit_id) == (None, "sess-1", "v1")
    assert build.updated_at == utc(2026, 3, 1, 4, 1, 0, 500_000)
    test = adopted_projection.get_node_runtime("run-ns", "test")
    assert (test.terminal_id, test.session_id) == ("term-2", None)
    assert test.updated_at == utc(2026, 3, 1, 3, 59, 59, 987_654)
    assert adopted_projection.has_processed_report("run-ist", "rep-1")
    assert adopted_projection.has_processed_report("run-mst", "rep-2")
    assert not adopted_projection.has_processed_report("gone-1", "rep-9")


def test_adopted_database_accepts_writes_with_foreign_keys(
    adopted: Adopted, adopted_projection: RunProjection
) -> None:
    projection = adopted_projection
    projection.update_node("run-ist", RunState.RUNNING, "deploy", "v2")
    assert projection.get_run("run-ist").current_node == "deploy"
    projection.record_processed_report("run-ist", "v2", "rep-3")
    assert projection.has_processed_report("run-ist", "rep-3")
    # The retention sweep now deletes by time: only run-utc finished before 04:15.
    assert projection.sweep_retention(utc(2026, 3, 1, 4, 15)) == ["run-utc"]
    assert [run.id for run in projection.list_runs()] == ["run-ns", "run-mst", "run-ist"]
    assert raw(adopted.legacy.path, "PRAGMA foreign_key_check") == []


# ------------------------------------------------------------ the identity ---


@pytest.mark.parametrize("grown", [False, True], ids=["fresh", "grown"])
@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param(None, None, id="marker-less"),
        pytest.param(
            {
                "executor_plugin": "goworkflows",
                "temporal_address": None,
                "temporal_namespace": None,
            },
            ExecutorIdentity("goworkflows"),
            id="goworkflows",
        ),
        pytest.param(
            {
                "executor_plugin": "temporal",
                "temporal_address": "temporal:7233",
                "temporal_namespace": "relay",
            },
            ExecutorIdentity("temporal", "temporal:7233", "relay"),
            id="temporal",
        ),
    ],
)
def test_generation_3_identity_marker_is_kept(
    tmp_path: Path, grown: bool, row: dict[str, Any] | None, expected: ExecutorIdentity | None
) -> None:
    legacy = build_legacy(tmp_path / "relay.db", 3, grown, identity=row)
    upgrade(legacy.path)
    projection = open_projection(legacy.path)
    try:
        assert projection.identity() == expected
        assert drift(legacy.path) == []
    finally:
        projection.engine.dispose()
    # Still a singleton: the CHECK constraint survived the adoption.
    connection = sqlite3.connect(legacy.path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            connection.execute(
                "INSERT INTO relay_executor_identity (singleton, executor_plugin) "
                "VALUES (2, 'goworkflows')"
            )
    finally:
        connection.close()


# ------------------------------------------------------------------ schema ---


def test_adopted_schema_has_no_drift(adopted: Adopted) -> None:
    assert drift(adopted.legacy.path) == []


def test_second_upgrade_is_a_no_op(adopted: Adopted, caplog: pytest.LogCaptureFixture) -> None:
    before = sqlite_dump(adopted.legacy.path)
    caplog.clear()

    upgrade(adopted.legacy.path)
    init_database(adopted.legacy.path)

    assert sqlite_dump(adopted.legacy.path) == before
    assert not [r for r in caplog.records if r.name == MIGRATION_LOGGER]


def test_tables_of_other_owners_are_untouched(adopted: Adopted) -> None:
    assert foreign_content(adopted.legacy.path) == adopted.foreign_before
    # Including Go-format text in a DATETIME column that is not ours.
    assert raw(adopted.legacy.path, "SELECT recorded_at FROM workflow_history ORDER BY id") == [
        ("2026-03-01 09:30:00.25+05:30",),
        ("2026-03-01 03:59:59.123456789+00:00",),
    ]
    assert raw(adopted.legacy.path, "SELECT event FROM workflow_history ORDER BY id") == [
        ("",),
        (None,),
    ]


def test_go_timestamp_helper_writes_go_layout() -> None:
    """The fixture text above is what the helper (and so the benchmarks) produce too."""
    from datetime import timedelta, timezone

    india = timezone(timedelta(hours=5, minutes=30))
    assert go_timestamp(datetime(2026, 3, 1, 9, 30, 0, 250_000, tzinfo=india)) == (
        "2026-03-01 09:30:00.25+05:30"
    )
    assert go_timestamp(utc(2026, 3, 1, 4)) == "2026-03-01 04:00:00+00:00"


# ------------------------------------------------------ unrecognised shapes ---


def _drop_column(path: Path, column: str) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.execute(f"ALTER TABLE relay_runs DROP COLUMN {column}")
        connection.commit()
    finally:
        connection.close()


def _execute(path: Path, script: str) -> None:
    connection = sqlite3.connect(path)
    try:
        connection.executescript(script)
    finally:
        connection.close()


def _runs_missing_a_column(path: Path) -> None:
    build_legacy(path, 1, False)
    _drop_column(path, "last_error")


def _runs_with_an_unknown_column(path: Path) -> None:
    build_legacy(path, 1, False)
    _execute(path, "ALTER TABLE relay_runs ADD COLUMN priority INTEGER;")


def _only_node_runtime(path: Path) -> None:
    create_schema(path, 2)
    _execute(
        path,
        "DROP TABLE relay_node_sessions; DROP TABLE relay_processed_reports; "
        "DROP TABLE relay_runs;",
    )


def _generation_2_without_sessions(path: Path) -> None:
    build_legacy(path, 2, False)
    _execute(path, "DROP TABLE relay_node_sessions;")


def _generation_3_without_attempt_id(path: Path) -> None:
    build_legacy(path, 3, True)
    _drop_column(path, "attempt_id")


def _generation_3_with_an_unknown_relay_table(path: Path) -> None:
    build_legacy(path, 3, False)
    _execute(path, "CREATE TABLE relay_future (id TEXT PRIMARY KEY);")


OPERATIONS: dict[str, Callable[[Path], object]] = {
    "upgrade": upgrade,
    "init_database": init_database,
    "open_projection": lambda path: open_projection(path, upgrade=True),
}


@pytest.mark.parametrize(
    "make",
    [
        _runs_missing_a_column,
        _runs_with_an_unknown_column,
        _only_node_runtime,
        _generation_2_without_sessions,
        _generation_3_without_attempt_id,
        _generation_3_with_an_unknown_relay_table,
    ],
)
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_unrecognised_relay_shape_is_refused_and_left_alone(
    tmp_path: Path, make: Any, operation: str
) -> None:
    path = tmp_path / "relay.db"
    make(path)
    before = sqlite_dump(path)

    with pytest.raises(NotAProjectionDatabase, match="match no known relay-flow release"):
        OPERATIONS[operation](path)

    assert sqlite_dump(path) == before
    assert stored_versions(path) is None


def test_adoption_on_a_foreign_keys_on_connection_refuses_rather_than_cascading(
    tmp_path: Path,
) -> None:
    """Rebuilding relay_runs with foreign keys on would cascade-delete every child row."""
    legacy = build_legacy(tmp_path / "relay.db", 2, True)
    counts = {table: raw(legacy.path, f"SELECT count(*) FROM {table}") for table in CHILDREN}
    engine = create_engine(legacy.path)  # the application's engine: foreign keys ON
    config = alembic_config()
    config.attributes["connection"] = engine
    try:
        # Alembic's own error type, as Alembic's API callers expect (one line on its CLI).
        with pytest.raises(CommandError, match="foreign keys"):
            command.upgrade(config, "head")
    finally:
        engine.dispose()

    # Refused before 0004 touched a row: even the orphans are still there.
    assert stored_versions(legacy.path) == ["0003_generation_3"]
    for table in CHILDREN:
        assert raw(legacy.path, f"SELECT count(*) FROM {table}") == counts[table], table

    upgrade(legacy.path)
    assert stored_versions(legacy.path) == [head_revision()]
    for table, children in CHILDREN.items():
        assert raw(legacy.path, f"SELECT count(*) FROM {table}") == [(len(children),)], table
    assert drift(legacy.path) == []
