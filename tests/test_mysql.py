"""What is MySQL/MariaDB's own: exact identifiers whatever the collation, idle and
killed connections, lock waits, and the error classes of API.md.

The functional suite runs on MariaDB too (conftest's "mysql" dialect); these
cases exercise what only this backend has. Each uses a database of its own on
the machine's server (made with the case-folding default collation), and
kills only its own connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.pool import NullPool

from relay_flow_projection import (
    DatabaseBusy,
    DatabaseUnavailable,
    ProjectionError,
    RunFilter,
    RunProjection,
    RunStart,
    RunState,
    create_engine,
    open_projection,
    upgrade,
)

T0 = datetime(2026, 5, 1, 9, 30, 0, 123456, tzinfo=UTC)


@pytest.fixture
def mysql_projection(mysql_url: str) -> Iterator[RunProjection]:
    upgrade(mysql_url)
    with open_projection(mysql_url) as projection:
        yield projection


def _admin(url: str) -> Engine:
    return sa.create_engine(url, poolclass=NullPool)


def test_identifiers_are_exact_under_a_case_folding_padding_collation(
    mysql_url: str, mysql_projection: RunProjection
) -> None:
    with _admin(mysql_url).connect() as connection:
        collation = connection.exec_driver_sql("SELECT @@collation_database").scalar_one()
        assert connection.exec_driver_sql("SELECT 'a' = 'A', 'a' = 'a '").one() == (1, 1)
    assert collation == "utf8mb4_general_ci"
    variants = ["run-a", "RUN-A", "run-a ", "run-\u00e9", "run-e\u0301"]  # é composed, decomposed
    for run_id in variants:
        mysql_projection.insert_start(RunStart(run_id, "Repo", "wf", "t", run_id.upper()), T0)
    assert sorted(run.id for run in mysql_projection.list_runs()) == sorted(variants)
    assert mysql_projection.get_run("run-a ").id == "run-a "
    assert mysql_projection.find_run_by_ticket("RUN-A ").id == "run-a "
    assert mysql_projection.has_active_repo("Repo") is True
    assert mysql_projection.has_active_repo("repo") is False
    assert mysql_projection.count_runs(RunFilter(repo="REPO")) == {}
    long_error = "é" * 70_000
    mysql_projection.update_state("run-a", RunState.BLOCKED, long_error)
    run = mysql_projection.get_run("run-a")
    assert run.last_error == long_error
    assert run.started_at == T0  # microseconds kept, aware UTC


def _counting(engine: Engine) -> dict[str, int]:
    seen = {"connect": 0, "error": 0}

    def on_connect(*_args: object) -> None:
        seen["connect"] += 1

    def on_error(*_args: object) -> None:
        seen["error"] += 1

    sa.event.listen(engine, "connect", on_connect)
    sa.event.listen(engine, "handle_error", on_error)
    return seen


def test_a_connection_idle_past_wait_timeout_is_replaced_before_use(mysql_url: str) -> None:
    upgrade(mysql_url)
    # This session's idle limit, 2 s: the server closes its connections after that.
    engine = create_engine(mysql_url, connect_args={"init_command": "SET SESSION wait_timeout = 2"})
    try:
        seen = _counting(engine)
        projection = RunProjection(engine)
        projection.insert_start(RunStart("r1", "repo", "wf", "t", "k"), T0)
        time.sleep(2.5)  # the server has closed the pooled connection by now
        projection.update_state("r1", RunState.RUNNING)
        assert projection.get_run("r1").state is RunState.RUNNING
        # A fresh connection, and no failed statement (no retry was needed).
        assert seen == {"connect": 2, "error": 0}
    finally:
        engine.dispose()


def _kill_connections_to(url: str) -> int:
    """KILL every connection to *url*'s database (the test's own), from outside."""
    database = make_url(url).database
    killed = 0
    with _admin(url).connect() as connection:
        own = connection.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
        ids = connection.execute(
            sa.text("SELECT id FROM information_schema.processlist WHERE db = :db AND id <> :own"),
            {"db": database, "own": own},
        ).scalars()
        for session in list(ids):
            connection.exec_driver_sql(f"KILL {int(session)}")
            killed += 1
    return killed


def test_a_killed_connection_is_discarded_and_the_call_retried(mysql_url: str) -> None:
    upgrade(mysql_url)
    engine = create_engine(mysql_url)
    try:
        projection = RunProjection(engine)
        projection.insert_start(RunStart("r1", "repo", "wf", "t", "k"), T0)
        assert _kill_connections_to(mysql_url) >= 1
        seen = _counting(engine)
        projection.update_state("r1", RunState.RUNNING)  # its pooled connection was killed
        assert projection.get_run("r1").state is RunState.RUNNING
        assert seen == {"error": 1, "connect": 1}  # one failure, one reconnect
    finally:
        engine.dispose()


def test_a_held_row_lock_is_waited_for_at_most_lock_timeout(mysql_url: str) -> None:
    upgrade(mysql_url)
    engine = create_engine(mysql_url, lock_timeout=1)
    holder = _admin(mysql_url)
    held = threading.Event()
    release = threading.Event()

    def hold_the_run() -> None:
        with holder.connect() as connection:
            connection.exec_driver_sql("SELECT id FROM relay_runs WHERE id = 'r1' FOR UPDATE")
            held.set()
            release.wait(30)
            connection.rollback()

    try:
        projection = RunProjection(engine)
        projection.insert_start(RunStart("r1", "repo", "wf", "t", "k"), T0)
        thread = threading.Thread(target=hold_the_run)
        thread.start()
        assert held.wait(10)
        started = time.monotonic()
        with pytest.raises(DatabaseBusy, match=r"update_state of run 'r1'.*lock_timeout \(1 s\)"):
            projection.update_state("r1", RunState.RUNNING)
        waited = time.monotonic() - started
        release.set()
        thread.join(30)
        assert waited < 10, waited  # not the server's 50 s default
        projection.update_state("r1", RunState.RUNNING)  # free again
    finally:
        release.set()
        engine.dispose()
        holder.dispose()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        pytest.param(
            {"database": "no_such_db_xyz"}, ProjectionError, "does not exist", id="unknown-database"
        ),
        pytest.param(
            {"username": "nobody_xyz", "password": "S3cretPW"},
            ProjectionError,
            "refused the login",
            id="access-denied",
        ),
        pytest.param({"port": 1}, DatabaseUnavailable, "unavailable", id="refused-connection"),
    ],
)
def test_what_cannot_connect_gets_its_own_error_class(
    mysql_url: str, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    url = make_url(mysql_url).set(**change).render_as_string(hide_password=False)
    with pytest.raises(error, match=message) as raised:
        open_projection(url)
    text = str(raised.value)
    assert "S3cretPW" not in text
    retryable = isinstance(raised.value, DatabaseUnavailable | DatabaseBusy)
    assert retryable == (error is DatabaseUnavailable), text
