"""The execution layer (execution.py): observers see every statement, failures below
SQLAlchemy leave nothing half-written, a dropped pool recovers on the first call,
engines do not accumulate, forks are safe, and timeouts and outages raise the
retryable errors of API.md."""

from __future__ import annotations

import gc
import os
import socket
import sqlite3
import threading
import time
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
import sqlalchemy as sa
from fakes import FakeClock
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    DatabaseBusy,
    DatabaseUnavailable,
    ExecutorIdentity,
    NodeRuntime,
    NodeSessionRegistration,
    ProjectionError,
    RetryStatus,
    RunFilter,
    RunProjection,
    RunStart,
    create_engine,
    open_projection,
)
from relay_flow_projection.dialect import folds_begin
from relay_flow_projection.engine import resolve_target
from relay_flow_projection.execution import DEADLOCK_ATTEMPTS, FairLock, SyncExecutor
from relay_flow_projection.operations import Operation

T0 = FakeClock().now


def _start(run_id: str) -> RunStart:
    return RunStart(
        id=run_id,
        logical_id="",
        attempt_id=1,
        repo="repo",
        workflow="wf",
        ticket_id="t",
        ticket_key=f"T-{run_id}",
    )


def _every_method(p: RunProjection) -> dict[str, Callable[[], object]]:
    """One call of every public method, in an order in which each one succeeds."""
    return {
        "insert_start": lambda: p.insert_start(_start("r1"), T0),
        "update_state": lambda: p.update_state("r1", "running"),
        "update_retry": lambda: p.update_retry("r1", RetryStatus(1, "boom", T0)),
        "update_node": lambda: p.update_node("r1", "running", "n1", "v1"),
        "get_run": lambda: p.get_run("r1"),
        "find_run_by_ticket": lambda: p.find_run_by_ticket("T-r1"),
        "find_run_by_logical_id": lambda: p.find_run_by_logical_id("r1"),
        "list_runs": lambda: p.list_runs(RunFilter(repo="repo"), limit=5),
        "iter_runs": lambda: list(p.iter_runs(batch_size=1)),
        "count_runs": lambda: p.count_runs(),
        "has_active_workflow": lambda: p.has_active_workflow("wf"),
        "has_active_repo": lambda: p.has_active_repo("repo"),
        "get_node_runtime": lambda: p.get_node_runtime("r1", "n1"),
        "load_node_runtime": lambda: p.load_node_runtime("r1", "n2"),
        "update_node_runtime": lambda: p.update_node_runtime(
            NodeRuntime("r1", "n2", "term", None, "v9")
        ),
        "update_node_runtime_visit": lambda: p.update_node_runtime_visit("r1", "n2", "v10"),
        "node_runtime_visit_is_current": lambda: p.node_runtime_visit_is_current("r1", "n1", "v1"),
        "replace_node_runtime": lambda: p.replace_node_runtime("r1", "n1", "v1", "t", None, "s0"),
        "clear_node_runtime": lambda: p.clear_node_runtime(
            "r1", "n1", clear_terminal=True, clear_session=True
        ),
        "list_node_runtimes": lambda: p.list_node_runtimes("r1"),
        "register_node_session": lambda: p.register_node_session(
            NodeSessionRegistration("r1", "n1", "s1")
        ),
        "has_processed_report": lambda: p.has_processed_report("r1", "rep"),
        "record_processed_report": lambda: p.record_processed_report("r1", "v1", "rep"),
        "identity": lambda: p.identity(),
        "initialize_identity": lambda: p.initialize_identity(ExecutorIdentity("goworkflows")),
        "verify_identity": lambda: p.verify_identity(ExecutorIdentity("goworkflows")),
        "count_sweepable": lambda: p.count_sweepable(T0),
        "sweep_retention": lambda: p.sweep_retention(T0 + timedelta(days=1)),
    }


def test_a_do_execute_listener_added_later_sees_every_statement(
    engine: Engine, clock: FakeClock
) -> None:
    projection = RunProjection(engine, clock=clock)
    seen: list[str] = []

    # DialectEvents: the lowest hook SQLAlchemy offers; returning None lets it execute.
    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
        seen.append(statement)

    def do_execute_no_params(cursor: Any, statement: str, context: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "do_execute", do_execute)
    sa.event.listen(engine, "do_execute_no_params", do_execute_no_params)
    try:
        silent = []
        for name, call in _every_method(projection).items():
            before = len(seen)
            call()
            if len(seen) == before:
                silent.append(name)
    finally:
        sa.event.remove(engine, "do_execute", do_execute)
        sa.event.remove(engine, "do_execute_no_params", do_execute_no_params)
    assert silent == []


# ------------------------------------------ failures below SQLAlchemy ---


class _Injector:
    """Which statement (by SQL fragment) or commit the wrapped driver fails next."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.fragment: str | None = None
        self.fail_commit = False
        self.fired = 0

    def check(self, sql: str) -> None:
        if self.fragment is not None and self.fragment in sql:
            self.fragment = None
            self.fired += 1
            raise self.error("injected failure below SQLAlchemy")


class _Cursor:
    def __init__(self, cursor: Any, injector: _Injector) -> None:
        object.__setattr__(self, "_cursor", cursor)
        object.__setattr__(self, "_injector", injector)

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._injector.check(sql)
        return self._cursor.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cursor, name, value)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)


class _Connection:
    """A DBAPI connection that delegates everything, failing where the injector says."""

    def __init__(self, connection: Any, injector: _Injector) -> None:
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_injector", injector)

    def cursor(self, *args: Any, **kwargs: Any) -> _Cursor:
        return _Cursor(self._connection.cursor(*args, **kwargs), self._injector)

    def commit(self) -> None:
        if self._injector.fail_commit:
            self._injector.fail_commit = False
            self._injector.fired += 1
            raise self._injector.error("injected commit failure below SQLAlchemy")
        self._connection.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)


@pytest.fixture
def wrapped(migrated_url: str, dialect: str) -> Iterator[tuple[Engine, _Injector]]:
    resolved = resolve_target(migrated_url)
    creator: Callable[[], Any]
    if dialect == "sqlite":
        injector = _Injector(sqlite3.OperationalError)
        path = str(resolved.path)

        def creator() -> Any:
            return _Connection(sqlite3.connect(path, check_same_thread=False), injector)
    elif dialect == "mysql":
        injector = _Injector(pymysql.err.OperationalError)
        url = resolved.url

        def creator() -> Any:
            connection = pymysql.connect(
                host=url.host, port=url.port or 3306, user=url.username, database=url.database,
                client_flag=pymysql.constants.CLIENT.FOUND_ROWS,  # as SQLAlchemy's dialect asks
            )  # fmt: skip
            return _Connection(connection, injector)
    else:
        injector = _Injector(psycopg.OperationalError)
        url = resolved.url
        conninfo = psycopg.conninfo.make_conninfo(
            host=url.host, port=url.port, user=url.username, dbname=url.database
        )
        options = url.query.get("options")

        def creator() -> Any:
            extra = {"options": options} if options else {}
            return _Connection(psycopg.connect(conninfo, **extra), injector)  # type: ignore[arg-type]

    # No hstore probe on PostgreSQL: it needs psycopg's own Connection class.
    extra: dict[str, Any] = {"use_native_hstore": False} if dialect == "postgresql" else {}
    engine = create_engine(migrated_url, creator=creator, **extra)
    yield engine, injector
    engine.dispose()


def _snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("relay_runs", "relay_node_runtime", "relay_node_sessions", "relay_processed_reports")
    with engine.connect() as connection:
        return {
            table: [tuple(row) for row in connection.exec_driver_sql(f"SELECT * FROM {table}")]
            for table in tables
        }


@pytest.mark.parametrize(
    "fragment",
    ["INSERT INTO relay_node_runtime", "COMMIT"],
    ids=["second-statement", "commit"],
)
def test_update_node_failing_below_sqlalchemy_writes_nothing(
    wrapped: tuple[Engine, _Injector], fragment: str
) -> None:
    engine, injector = wrapped
    projection = RunProjection(engine, clock=FakeClock())
    projection.insert_start(_start("r1"), T0)
    projection.update_node("r1", "running", "n1", "v1")
    before = _snapshot(engine)
    if fragment == "COMMIT" and not folds_begin(engine.dialect):
        injector.fail_commit = True  # the DBAPI's commit()
    else:
        injector.fragment = fragment  # psycopg: the layer sends COMMIT as a statement
    with pytest.raises(ProjectionError, match="update_node of run 'r1' node 'n2'"):
        projection.update_node("r1", "waiting", "n2", "v2")
    assert injector.fired == 1
    assert _snapshot(engine) == before
    projection.update_node("r1", "waiting", "n2", "v2")  # and the connection is usable again
    assert projection.get_run("r1").current_node == "n2"


@pytest.mark.parametrize(
    "fragment",
    ["SELECT relay_node_sessions.node_visit_id", "UPDATE relay_node_runtime SET session_id"],
    ids=["after-insert", "bind"],
)
def test_register_node_session_failing_below_sqlalchemy_writes_nothing(
    wrapped: tuple[Engine, _Injector], fragment: str
) -> None:
    engine, injector = wrapped
    projection = RunProjection(engine, clock=FakeClock())
    projection.insert_start(_start("r1"), T0)
    projection.update_node("r1", "running", "n1", "v1")
    before = _snapshot(engine)
    injector.fragment = fragment
    with pytest.raises(ProjectionError, match="session 's1' for node 'n1' of run 'r1'"):
        projection.register_node_session(NodeSessionRegistration("r1", "n1", "s1"))
    assert injector.fired == 1
    assert _snapshot(engine) == before
    assert projection.register_node_session(NodeSessionRegistration("r1", "n1", "s1"))


# ------------------------------------------------ dropped connections ---


def _queue_pool(engine: Engine) -> sa.pool.QueuePool:
    assert isinstance(engine.pool, sa.pool.QueuePool)
    return engine.pool


def _terminate_backends(url: str, application_name: str) -> int:
    admin = sa.create_engine(
        resolve_target(url).url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    try:
        with admin.connect() as connection:
            rows = connection.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": application_name},
            )
            return len(rows.all())
    finally:
        admin.dispose()


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_after_every_pooled_connection_is_dropped_the_first_call_succeeds(
    migrated_url: str,
) -> None:
    """Five warm pooled connections die (as in a restart); no call fails afterwards."""
    name = f"relay_drop_{os.getpid()}_{time.monotonic_ns()}"
    engine = create_engine(migrated_url, pool_size=5, connect_args={"application_name": name})
    projection = RunProjection(engine, clock=FakeClock())
    try:
        projection.insert_start(_start("r1"), T0)
        barrier = threading.Barrier(5)

        def hold() -> None:
            with engine.connect():
                barrier.wait()  # five connections checked out at once: all five pooled

        threads = [threading.Thread(target=hold) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _queue_pool(engine).checkedin() == 5
        # The pool's five, and the one the projection may still hold (held_connection.py).
        assert _terminate_backends(migrated_url, name) in (5, 6)
        failures = []
        for method, call in _every_method(projection).items():
            try:
                call()
            except ProjectionError as exc:  # pragma: no cover - the assertion shows which
                failures.append(f"{method}: {exc}")
        assert failures == []
    finally:
        engine.dispose()


# ------------------------------------------------------ no growth -------


def test_creating_and_disposing_200_projections_keeps_memory_flat(migrated_url: str) -> None:
    """Statement caches hold no engine: 200 engines come and go, memory levels off.

    (The first projections fill SQLAlchemy's and the drivers' process-wide caches;
    flat means the second hundred adds next to nothing.)
    """

    def cycle() -> weakref.ref[Engine]:
        engine = create_engine(migrated_url)
        with RunProjection(engine) as projection:
            projection.insert_start(_start("r1"), T0)
            projection.get_run("r1")
            projection.update_node("r1", "running", "n1", "v1")
            projection.list_runs(RunFilter(active=True), limit=2)
        engine.dispose()
        return weakref.ref(engine)

    gc.collect()
    tracemalloc.start()
    try:
        first = [cycle() for _ in range(100)]
        gc.collect()
        middle = tracemalloc.get_traced_memory()[0]
        second = [cycle() for _ in range(100)]
        gc.collect()
        end = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert [ref for ref in first + second if ref() is not None] == []
    # One engine with its pool and dialect is ~100 kB: keeping even one would show.
    assert end - middle < 64 * 1024, f"grew by {end - middle} bytes over 100 projections"


def test_projections_from_open_projection_release_their_engines(migrated_url: str) -> None:
    refs = []
    for _ in range(20):
        with open_projection(migrated_url) as projection:
            projection.identity()
            refs.append(weakref.ref(projection.engine))
    del projection  # the loop variable would keep the last one alive
    gc.collect()
    assert [ref for ref in refs if ref() is not None] == []


# ----------------------------------------------------------- fork -------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_projection_created_before_fork_works_in_the_child(migrated_url: str) -> None:
    engine = create_engine(migrated_url, pool_size=2)
    projection = RunProjection(engine, clock=FakeClock())
    projection.insert_start(_start("parent"), T0)
    projection.get_run("parent")  # a warm pool: one connection checked in
    assert _queue_pool(engine).checkedin() >= 1
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            for index in range(20):
                projection.insert_start(_start(f"child{index}"), T0)
                projection.update_node(f"child{index}", "running", "n", "v")
                assert projection.get_run(f"child{index}").current_node == "n"
            code = 0
        finally:
            os._exit(code)
    # The parent keeps using its inherited-by-nobody connections meanwhile.
    for index in range(20):
        projection.update_node("parent", "running", f"n{index}", "v")
        assert projection.get_run("parent").current_node == f"n{index}"
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(projection.list_runs()) == 21
    engine.dispose()


# ------------------------------------------------------- timeouts -------


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_sqlite_lock_timeout_is_one_budget_for_queue_and_busy_timeout(
    migrated_url: str,
) -> None:
    """Another process holds the write lock: every one of four threads gives up after
    about lock_timeout, not after its turn in the queue plus a full busy timeout."""
    engine = create_engine(migrated_url, lock_timeout=1.0)
    projection = RunProjection(engine, clock=FakeClock())
    projection.insert_start(_start("r1"), T0)
    holder = sqlite3.connect(str(resolve_target(migrated_url).path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    elapsed: list[float] = []
    errors: list[BaseException] = []

    def write() -> None:
        started = time.monotonic()
        try:
            projection.update_node("r1", "running", "n", "v")
        except BaseException as exc:
            errors.append(exc)
        elapsed.append(time.monotonic() - started)

    threads = [threading.Thread(target=write) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        holder.rollback()
        holder.close()
    assert len(errors) == 4
    assert all(isinstance(error, DatabaseBusy) for error in errors), errors
    assert all("run 'r1'" in str(error) for error in errors)
    # One budget: the last thread in the queue fails at ~1 s too (2 s would mean 2 budgets).
    assert max(elapsed) < 1.9, elapsed
    projection.update_node("r1", "running", "n", "v")  # free again: succeeds
    engine.dispose()


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_postgresql_row_lock_wait_ends_in_database_busy_naming_the_run(
    migrated_url: str,
) -> None:
    engine = create_engine(migrated_url, lock_timeout=0.3)
    projection = RunProjection(engine, clock=FakeClock())
    projection.insert_start(_start("r1"), T0)
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT 1 FROM relay_runs WHERE id = 'r1' FOR UPDATE"))
        started = time.monotonic()
        with pytest.raises(DatabaseBusy, match="update_node of run 'r1'"):
            projection.update_node("r1", "running", "n", "v")
        assert time.monotonic() - started < 5
        holder.rollback()
    projection.update_node("r1", "running", "n", "v")
    assert projection.get_run("r1").current_node == "n"
    engine.dispose()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


def test_a_server_that_never_answers_gives_database_unavailable(silent_server: int) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/x"
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match=f"127.0.0.1:{silent_server}"):
        open_projection(url, connect_timeout=2)
    assert time.monotonic() - started < 10


def test_a_refused_connection_gives_database_unavailable_on_every_call() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = create_engine(f"postgresql://postgres@127.0.0.1:{port}/x", connect_timeout=2)
    projection = RunProjection(engine)
    for method, call in _every_method(projection).items():
        with pytest.raises(DatabaseUnavailable):
            call()
        assert method  # every method, by name in the parametrized failure
    engine.dispose()


# --------------------------------------------------- opening errors -----


def test_a_malformed_port_says_which_part_is_wrong() -> None:
    with pytest.raises(ProjectionError, match="port must be a number"):
        create_engine("postgresql://postgres@127.0.0.1:notaport/x")


def test_a_missing_driver_names_the_extra_to_install(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from relay_flow_projection import create_engine, ProjectionError\n"
        "try:\n"
        "    create_engine('postgresql://postgres@127.0.0.1/x')\n"
        "except ProjectionError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert 'pip install "relay-flow-projection[postgresql]"' in result.stdout


@pytest.mark.parametrize("dialect", ["sqlite"], indirect=True)
def test_writes_to_a_read_only_sqlite_database_say_so(migrated_url: str) -> None:
    path = resolve_target(migrated_url).path
    engine = sa.create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    projection = RunProjection(engine)
    assert projection.list_runs() == []
    with pytest.raises(ProjectionError, match="read-only"):
        projection.insert_start(_start("r1"), T0)
    engine.dispose()


# ------------------------------------------------ the writer queue -------


def test_writer_queue_is_first_come_first_served() -> None:
    """The releasing thread cannot take the lock back ahead of those waiting.

    With a plain threading.Lock a thread writing in a loop (the retention
    sweep) re-took the lock batch after batch while other writers waited.
    """
    lock = FairLock()
    assert lock.acquire(timeout=1)
    order: list[str] = []
    queued: list[threading.Thread] = []

    def waiter(name: str) -> None:
        assert lock.acquire(timeout=10)
        order.append(name)
        lock.release()

    for name in ("first", "second", "third"):
        thread = threading.Thread(target=waiter, args=(name,))
        thread.start()
        queued.append(thread)
        deadline = time.monotonic() + 5
        while len(lock._waiters) < len(queued) and time.monotonic() < deadline:
            time.sleep(0.001)
    lock.release()
    # The former holder asks again at once: it must queue behind all three.
    assert lock.acquire(timeout=10)
    order.append("former holder")
    lock.release()
    for thread in queued:
        thread.join(10)
    assert order == ["first", "second", "third", "former holder"]


def test_writer_queue_timeout_leaves_the_queue_intact() -> None:
    lock = FairLock()
    assert lock.acquire(timeout=1)
    started = time.monotonic()
    assert lock.acquire(timeout=0.05) is False
    assert 0.04 < time.monotonic() - started < 2
    assert not lock._waiters
    lock.release()
    assert lock.acquire(timeout=0.01)  # free again
    lock.release()


# ------------------------------------------------------------- deadlocks ---


def _deadlock(kind: str) -> sa.exc.DBAPIError:
    """What SQLAlchemy raises when the server broke a deadlock by rolling us back."""
    if kind == "mysql":
        orig: Exception = pymysql.err.OperationalError(
            1213, "Deadlock found when trying to get lock"
        )
    else:
        orig = psycopg.errors.DeadlockDetected("deadlock detected")
    return sa.exc.OperationalError("UPDATE relay_runs ...", {}, orig)


@pytest.mark.parametrize("kind", ["mysql", "postgresql"])
def test_a_deadlock_is_retried_inside_the_call_then_raised_as_busy(
    kind: str, sqlite_path: Path
) -> None:
    """The whole transaction was rolled back and every write is idempotent: the call runs
    again (a few times), and only then is the deadlock the caller's, as DatabaseBusy."""
    engine = create_engine(str(sqlite_path))
    executor = SyncExecutor(engine)
    attempts: list[int] = []

    def deadlocks_until(succeeding: int) -> Operation[str]:
        def body(conn: Any) -> str:
            attempts.append(1)
            if len(attempts) < succeeding:
                raise _deadlock(kind)
            return "done"

        return Operation("update_state of run 'r1'", body, writes=True)

    try:
        assert executor.run(deadlocks_until(DEADLOCK_ATTEMPTS)) == "done"
        assert len(attempts) == DEADLOCK_ATTEMPTS
        attempts.clear()
        with pytest.raises(DatabaseBusy, match="update_state of run 'r1'"):
            executor.run(deadlocks_until(DEADLOCK_ATTEMPTS + 1))
        assert len(attempts) == DEADLOCK_ATTEMPTS
    finally:
        engine.dispose()
