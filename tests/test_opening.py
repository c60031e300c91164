"""Opening databases: engines, file modes, refusing what is not a projection, read-only checks.

SQLite-only tests are about files, pragmas and locks; everything else runs on
both databases through ``db_url``.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import stat
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from legacy_databases import create_schema, go_timestamp, insert_rows, sqlite_dump, stored_versions
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    ExecutorIdentity,
    IdentityMismatch,
    InvalidIdentity,
    NotAProjectionDatabase,
    ProjectionError,
    RunProjection,
    RunStart,
    RunState,
    SchemaOutOfDate,
    create_engine,
    has_nonterminal_runs,
    init_database,
    init_database_with_identity,
    open_projection,
    upgrade,
)
from relay_flow_projection.engine import resolve_target
from relay_flow_projection.migrate import head_revision

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GOWORKFLOWS = ExecutorIdentity("goworkflows")
TEMPORAL = ExecutorIdentity("temporal", "temporal:7233", "relay")

sqlite_only = pytest.mark.sqlite_only


# ----------------------------------------------------------------- helpers ---


@contextmanager
def plain_connection(target: str) -> Iterator[sa.Connection]:
    url = resolve_target(target).url.render_as_string(hide_password=False)
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


def current_versions(target: str) -> list[str] | None:
    with plain_connection(target) as connection:
        if not sa.inspect(connection).has_table("alembic_version"):
            return None
        query = sa.text("SELECT version_num FROM alembic_version")
        return list(connection.execute(query).scalars())


def table_names(target: str) -> list[str]:
    with plain_connection(target) as connection:
        return sorted(sa.inspect(connection).get_table_names())


@contextmanager
def projection_on(target: str) -> Iterator[RunProjection]:
    projection = open_projection(target)
    try:
        yield projection
    finally:
        projection.engine.dispose()


def start(run_id: str) -> RunStart:
    return RunStart(run_id, "acme/app", "deliver", f"T-{run_id}", f"ACME-{run_id}")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mkdb(path: Path) -> None:
    """A SQLite database that is not a projection (one foreign table)."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("CREATE TABLE other (id INTEGER PRIMARY KEY, note TEXT)")
        connection.execute("INSERT INTO other (note) VALUES ('kept')")
        connection.commit()
    finally:
        connection.close()


def random_text(size: int = 200) -> bytes:
    chars = string.ascii_letters + string.digits + string.punctuation + " \n"
    return "".join(random.Random(20260301).choice(chars) for _ in range(size)).encode()


# ------------------------------------------------------------ SQLite engine ---


@sqlite_only
def test_sqlite_engine_pragmas(sqlite_path: Path) -> None:
    engine = create_engine(sqlite_path)
    try:
        with engine.connect() as connection:
            pragma = connection.exec_driver_sql
            assert pragma("PRAGMA journal_mode").scalar() == "wal"
            assert pragma("PRAGMA foreign_keys").scalar() == 1
            assert (pragma("PRAGMA busy_timeout").scalar() or 0) > 0
            assert pragma("PRAGMA synchronous").scalar() == 1  # NORMAL
    finally:
        engine.dispose()


@sqlite_only
@pytest.mark.parametrize("target_form", ["path", "str", "url"])
def test_every_target_form_gets_the_same_engine(sqlite_path: Path, target_form: str) -> None:
    forms: dict[str, str | Path] = {
        "path": sqlite_path,
        "str": str(sqlite_path),
        "url": f"sqlite:///{sqlite_path}",
    }
    target = forms[target_form]
    engine = create_engine(target)
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()
    assert mode(sqlite_path) == 0o600


@sqlite_only
def test_write_transactions_take_the_write_lock_at_begin(sqlite_path: Path) -> None:
    init_database(sqlite_path)
    engine = create_engine(sqlite_path)
    other = sqlite3.connect(sqlite_path, timeout=0, isolation_level=None)
    try:
        with engine.begin() as connection:
            # Only a read so far: a deferred transaction would hold no lock yet.
            connection.execute(sa.text("SELECT count(*) FROM relay_runs")).scalar_one()
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
        engine.dispose()


@sqlite_only
def test_reads_do_not_wait_for_the_write_lock(sqlite_path: Path) -> None:
    init_database(sqlite_path)
    with projection_on(str(sqlite_path)) as projection:
        projection.insert_start(start("r1"), T0)
    writer = sqlite3.connect(sqlite_path, timeout=0, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE relay_runs SET state = 'completed' WHERE id = 'r1'")
        # Another process holds the write lock: every read still answers at
        # once (a read taking the lock would wait out busy_timeout and fail),
        # and sees only committed data.
        with projection_on(str(sqlite_path)) as projection:
            assert projection.get_run("r1").state is RunState.STARTING
            assert [run.id for run in projection.list_runs()] == ["r1"]
            assert projection.count_runs() == {RunState.STARTING: 1}
            assert projection.has_active_workflow("deliver")
            assert projection.identity() is None
        assert has_nonterminal_runs(sqlite_path)
        writer.execute("COMMIT")
    finally:
        writer.close()
    assert not has_nonterminal_runs(sqlite_path)


# --------------------------------------------------------------- file modes ---


@sqlite_only
@pytest.mark.parametrize("mask", [0o022, 0o002, 0o000], ids=oct)
def test_new_database_and_its_wal_files_are_private(sqlite_path: Path, mask: int) -> None:
    with umask(mask):
        init_database(sqlite_path)
        engine = create_engine(sqlite_path)
        try:
            RunProjection(engine).insert_start(start("r1"), T0)
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT count(*) FROM relay_runs")).scalar_one()
                wal = Path(f"{sqlite_path}-wal")
                shm = Path(f"{sqlite_path}-shm")
                assert wal.exists()
                assert shm.exists()
                assert {p.name: mode(p) for p in (sqlite_path, wal, shm)} == {
                    sqlite_path.name: 0o600,
                    wal.name: 0o600,
                    shm.name: 0o600,
                }
        finally:
            engine.dispose()
    assert mode(sqlite_path) == 0o600


@sqlite_only
@pytest.mark.parametrize("content", ["empty", "database", "legacy"])
def test_existing_readable_file_is_tightened(sqlite_path: Path, content: str) -> None:
    if content == "empty":
        sqlite_path.touch()
    elif content == "database":
        mkdb(sqlite_path)
    else:
        create_schema(sqlite_path, 1)
    os.chmod(sqlite_path, 0o644)

    with umask(0o022):
        init_database(sqlite_path)

    assert mode(sqlite_path) == 0o600
    assert stored_versions(sqlite_path) == [head_revision()]


@sqlite_only
def test_create_engine_alone_tightens_an_existing_file(sqlite_path: Path) -> None:
    mkdb(sqlite_path)
    os.chmod(sqlite_path, 0o666)
    create_engine(sqlite_path).dispose()
    assert mode(sqlite_path) == 0o600


# ----------------------------------------------------------- init_database ---


def test_init_database_creates_and_reaches_head(db_url: str) -> None:
    init_database(db_url)
    assert current_versions(db_url) == [head_revision()]
    assert set(table_names(db_url)) >= {
        "relay_runs",
        "relay_node_runtime",
        "relay_processed_reports",
        "relay_node_sessions",
        "relay_executor_identity",
    }
    init_database(db_url)  # idempotent
    assert current_versions(db_url) == [head_revision()]


@sqlite_only
def test_init_database_creates_a_missing_file(sqlite_path: Path) -> None:
    assert not sqlite_path.exists()
    init_database(sqlite_path)
    assert sqlite_path.is_file()
    assert mode(sqlite_path) == 0o600
    assert stored_versions(sqlite_path) == [head_revision()]


@sqlite_only
def test_init_database_in_a_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "relay.db"
    with pytest.raises(ProjectionError, match="missing"):
        init_database(target)
    assert not (tmp_path / "missing").exists()


# ------------------------------------------------ files that are not databases ---

OPERATIONS: dict[str, Callable[[str | Path], object]] = {
    "create_engine": create_engine,
    "init_database": init_database,
    "init_database_with_identity": lambda t: init_database_with_identity(t, GOWORKFLOWS),
    "upgrade": upgrade,
    "open_projection": open_projection,
    "open_projection(upgrade=True)": lambda t: open_projection(t, upgrade=True),
    "has_nonterminal_runs": has_nonterminal_runs,
}
TARGET_FORMS: dict[str, Callable[[Path], str | Path]] = {
    "path": lambda p: p,
    "url": lambda p: f"sqlite:///{p}",
}


def _truncated_mid_page(path: Path) -> None:
    init_database(path)
    data = path.read_bytes()
    assert len(data) > 4096
    path.write_bytes(data[:1000])


def _truncated_at_page_boundary(path: Path) -> None:
    init_database(path)
    data = path.read_bytes()
    page_size = int.from_bytes(data[16:18], "big")
    assert len(data) >= 2 * page_size
    path.write_bytes(data[:page_size])


def _header_only(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00")


def _random_text(path: Path) -> None:
    path.write_bytes(random_text())


@sqlite_only
@pytest.mark.parametrize("form", list(TARGET_FORMS))
@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize(
    "make", [_random_text, _header_only, _truncated_mid_page, _truncated_at_page_boundary]
)
def test_file_that_is_not_a_database_is_refused_and_untouched(
    tmp_path: Path, make: Callable[[Path], None], operation: str, form: str
) -> None:
    directory = tmp_path / "data"
    directory.mkdir()
    path = directory / "relay.db"
    make(path)
    os.chmod(path, 0o644)
    before = path.read_bytes()
    files = sorted(p.name for p in directory.iterdir())
    assert f"{path.name}-wal" not in files

    with pytest.raises(NotAProjectionDatabase, match=r"relay\.db"):
        OPERATIONS[operation](TARGET_FORMS[form](path))

    assert path.read_bytes() == before
    assert mode(path) == 0o644
    assert sorted(p.name for p in directory.iterdir()) == files  # no -wal, -shm, ...


@sqlite_only
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_directory_is_refused(tmp_path: Path, operation: str) -> None:
    target = tmp_path / "relay.db"
    target.mkdir()
    with pytest.raises(NotAProjectionDatabase, match="directory"):
        OPERATIONS[operation](target)
    assert list(target.iterdir()) == []


@sqlite_only
def test_invalid_identity_wins_over_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    path.write_bytes(random_text())
    with pytest.raises(InvalidIdentity):
        init_database_with_identity(path, ExecutorIdentity("temporal"))
    assert path.read_bytes() == random_text()


# ---------------------------------------------------- has_nonterminal_runs ---


@sqlite_only
def test_has_nonterminal_runs_on_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(ProjectionError, match=r"relay\.db"):
        has_nonterminal_runs(tmp_path / "relay.db")
    with pytest.raises(ProjectionError, match=r"relay\.db"):
        has_nonterminal_runs(f"sqlite:///{tmp_path / 'relay.db'}")
    assert list(tmp_path.iterdir()) == []


def test_has_nonterminal_runs_without_the_projection(db_url: str, dialect: str) -> None:
    if dialect == "sqlite":
        mkdb(Path(db_url))
    before = table_names(db_url)

    with pytest.raises(ProjectionError, match="no relay projection"):
        has_nonterminal_runs(db_url)

    assert table_names(db_url) == before
    assert current_versions(db_url) is None


def test_has_nonterminal_runs_answers_on_a_migrated_database(db_url: str) -> None:
    init_database(db_url)
    assert has_nonterminal_runs(db_url) is False
    with projection_on(db_url) as projection:
        projection.insert_start(start("r1"), T0)
        projection.insert_start(start("r2"), T0)
        assert has_nonterminal_runs(db_url) is True
        projection.update_state("r1", RunState.COMPLETED, finished_at=T0)
        assert has_nonterminal_runs(db_url) is True
        projection.update_state("r2", RunState.CANCELED, finished_at=T0)
    assert has_nonterminal_runs(db_url) is False


def test_has_nonterminal_runs_never_migrates(db_url: str) -> None:
    upgrade(db_url, "0001_generation_1")
    with plain_connection(db_url) as connection:
        runs = sa.table(
            "relay_runs",
            *(sa.column(c) for c in ("id", "repo", "workflow", "ticket_id", "ticket_key")),
            sa.column("state"),
            sa.column("started_at", sa.DateTime(timezone=True)),
            sa.column("updated_at", sa.DateTime(timezone=True)),
        )
        values = {"repo": "r", "workflow": "w", "ticket_id": "t", "ticket_key": "k"}
        connection.execute(
            sa.insert(runs),
            [
                {"id": "a", "state": "completed", "started_at": T0, "updated_at": T0, **values},
                {"id": "b", "state": "blocked", "started_at": T0, "updated_at": T0, **values},
            ],
        )
    before = table_names(db_url)

    assert has_nonterminal_runs(db_url) is True

    assert current_versions(db_url) == ["0001_generation_1"]
    assert table_names(db_url) == before


@sqlite_only
@pytest.mark.parametrize("active", [True, False])
def test_has_nonterminal_runs_on_an_unversioned_go_database(
    sqlite_path: Path, active: bool
) -> None:
    create_schema(sqlite_path, 1)
    stamp = go_timestamp(datetime(2026, 3, 1, 9, 30, 0, 250_000, tzinfo=UTC))
    rows: list[dict[str, str | None]] = [
        {"id": "done", "state": "completed", "finished_at": stamp},
        {"id": "gone", "state": "canceled", "finished_at": stamp},
    ]
    if active:
        rows.append({"id": "live", "state": "waiting", "finished_at": None})
    common = {"repo": "r", "workflow": "w", "ticket_id": "t", "ticket_key": "k", "last_error": ""}
    stamps = {"started_at": stamp, "updated_at": stamp}
    insert_rows(sqlite_path, "relay_runs", [{**row, **common, **stamps} for row in rows])
    before = sqlite_dump(sqlite_path)

    assert has_nonterminal_runs(sqlite_path) is active

    assert sqlite_dump(sqlite_path) == before
    assert stored_versions(sqlite_path) is None


# ---------------------------------------------------------- open_projection ---


def test_open_projection_refuses_an_old_revision(db_url: str) -> None:
    upgrade(db_url, "0004_adopt_legacy_rows")

    with pytest.raises(SchemaOutOfDate) as raised:
        open_projection(db_url)
    assert "0004_adopt_legacy_rows" in str(raised.value)
    assert head_revision() in str(raised.value)
    assert current_versions(db_url) == ["0004_adopt_legacy_rows"]

    projection = open_projection(db_url, upgrade=True)
    try:
        projection.insert_start(start("r1"), T0)
        assert projection.get_run("r1").started_at == T0
    finally:
        projection.engine.dispose()
    assert current_versions(db_url) == [head_revision()]


def test_open_projection_refuses_an_empty_database(db_url: str, dialect: str) -> None:
    if dialect == "sqlite":
        Path(db_url).touch()
    with pytest.raises(SchemaOutOfDate, match=r"\(none\)"):
        open_projection(db_url)
    assert table_names(db_url) == []


@sqlite_only
def test_open_projection_on_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    for target in (path, f"sqlite:///{path}"):
        missing = f"{re.escape(str(path))} does not exist"
        with pytest.raises(ProjectionError, match=missing) as raised:
            open_projection(target)
        assert not isinstance(raised.value, SchemaOutOfDate)  # nothing to upgrade: no file
    assert list(tmp_path.iterdir()) == []

    projection = open_projection(path, upgrade=True)
    projection.engine.dispose()
    assert stored_versions(path) == [head_revision()]
    assert mode(path) == 0o600


@sqlite_only
def test_open_projection_does_not_wait_for_the_write_lock(sqlite_path: Path) -> None:
    init_database(sqlite_path)
    writer = sqlite3.connect(sqlite_path, timeout=0, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("DELETE FROM relay_runs")
        # Checking the revision is a read: it must not queue behind the writer.
        with projection_on(str(sqlite_path)) as projection:
            assert projection.list_runs() == []
        writer.execute("ROLLBACK")
    finally:
        writer.close()


# ------------------------------------------------- init_database_with_identity ---

INVALID_IDENTITIES = [
    pytest.param(ExecutorIdentity("temporal"), id="temporal-without-address"),
    pytest.param(ExecutorIdentity("temporal", "temporal:7233", "  "), id="blank-namespace"),
    pytest.param(ExecutorIdentity("goworkflows", "temporal:7233"), id="goworkflows-with-address"),
    pytest.param(ExecutorIdentity("cadence"), id="unknown-plugin"),
]


@pytest.mark.parametrize("identity", INVALID_IDENTITIES)
def test_invalid_identity_touches_nothing(
    db_url: str, dialect: str, tmp_path: Path, identity: ExecutorIdentity
) -> None:
    with pytest.raises(InvalidIdentity):
        init_database_with_identity(db_url, identity)
    if dialect == "sqlite":
        assert list(tmp_path.iterdir()) == []
    else:
        assert table_names(db_url) == []


@pytest.mark.parametrize("identity", [GOWORKFLOWS, TEMPORAL], ids=["goworkflows", "temporal"])
def test_identity_is_written_then_verified(db_url: str, identity: ExecutorIdentity) -> None:
    init_database_with_identity(db_url, identity)
    assert current_versions(db_url) == [head_revision()]
    with projection_on(db_url) as projection:
        assert projection.identity() == identity

    init_database_with_identity(db_url, identity)  # the same again: verified

    other = TEMPORAL if identity == GOWORKFLOWS else GOWORKFLOWS
    with pytest.raises(IdentityMismatch):
        init_database_with_identity(db_url, other)
    with pytest.raises(IdentityMismatch):
        init_database_with_identity(db_url, ExecutorIdentity("temporal", "elsewhere:7233", "relay"))
    with projection_on(db_url) as projection:
        assert projection.identity() == identity


def test_identity_on_an_existing_projection_keeps_its_runs(db_url: str) -> None:
    init_database(db_url)
    with projection_on(db_url) as projection:
        projection.insert_start(start("r1"), T0)
    init_database_with_identity(db_url, TEMPORAL)
    with projection_on(db_url) as projection:
        assert projection.identity() == TEMPORAL
        assert [run.id for run in projection.list_runs()] == ["r1"]
