"""Time-sized sweep batches (retention.Sweep): how the next size follows measured time,
that the measured time covers the commit, and how the sweep's SQLite transactions
treat foreign keys.

No speed is asserted here (benchmarks/run.py measures it); the controller is
driven with synthetic times, and the database cases only check which way sizes
move and what the database holds afterwards.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from relay_flow_projection import RunProjection, RunStart, RunState, create_engine, upgrade
from relay_flow_projection import execution as execution_module
from relay_flow_projection.engine import build_engine, resolve_target
from relay_flow_projection.retention import AIM, DEFAULT_TARGET_BATCH_SECONDS, FIRST_BATCH, Sweep
from relay_flow_projection.schema import RUN_CHILD_TABLES, metadata, runs

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CUTOFF = T0 + timedelta(days=1)


def _sweep(batch_size: int = 100_000, target: float = 0.075) -> Sweep:
    return Sweep(CUTOFF, batch_size=batch_size, target_batch_seconds=target)


def _drive(sweep: Sweep, seconds_for: Any, batches: int) -> list[tuple[int, float]]:
    """Sizes and times of *batches* batches whose time is ``seconds_for(size)``."""
    history = []
    for _ in range(batches):
        size = sweep.size
        elapsed = seconds_for(size)
        history.append((size, elapsed))
        sweep.size = sweep.next_size(size, size, elapsed)
    return history


AIMED = AIM * 0.075  # what batches are sized to take under the default target


def test_the_default_target_is_75_ms_and_the_first_batch_200_runs() -> None:
    assert DEFAULT_TARGET_BATCH_SECONDS == 0.075
    assert 0.5 <= AIM < 1
    assert _sweep().size == FIRST_BATCH == 200
    assert _sweep(batch_size=50).size == 50


@pytest.mark.parametrize(
    ("fixed", "per_run"),
    [(0.0, 20e-6), (0.010, 20e-6), (0.030, 40e-6), (0.002, 1e-6), (0.040, 2e-6)],
    ids=["no-fixed-cost", "10ms+20us", "30ms+40us", "fast", "fixed-dominated"],
)
def test_sizes_converge_from_below_without_oscillating(fixed: float, per_run: float) -> None:
    """A batch costs a fixed part plus a part per run: sizes rise (at most doubling)
    and settle where a batch takes the aim (70% of the target), never swinging back
    and forth."""
    history = _drive(_sweep(), lambda size: fixed + per_run * size, 40)
    sizes = [size for size, _ in history]
    assert all(b >= a for a, b in itertools.pairwise(sizes)), sizes
    assert all(b <= 2 * a for a, b in itertools.pairwise(sizes)), sizes
    settled = history[-1][1]
    assert 0.9 * AIMED <= settled <= AIMED * 1.001, history[-5:]
    assert max(elapsed for _, elapsed in history) <= AIMED * 1.001


def test_sizes_converge_from_above_too() -> None:
    sweep = _sweep()
    sweep.size = 50_000  # e.g. the machine slowed down
    history = _drive(sweep, lambda size: 0.005 + 30e-6 * size, 30)
    sizes = [size for size, _ in history]
    assert all(b <= a for a, b in itertools.pairwise(sizes[1:])), sizes
    assert 0.9 * AIMED <= history[-1][1] <= AIMED * 1.001


def test_one_slow_batch_shrinks_the_next_at_once_then_sizes_recover() -> None:
    sweep = _sweep()

    def normal(size: int) -> float:
        return 0.005 + 20e-6 * size

    _drive(sweep, normal, 20)
    settled = sweep.size
    sweep.size = sweep.next_size(settled, settled, 10 * normal(settled))  # a 10x stall
    assert sweep.size <= settled // 9
    history = _drive(sweep, normal, 12)
    assert history[-1][0] >= 0.9 * settled
    assert max(elapsed for _, elapsed in history) <= AIMED * 1.001


def test_alternating_costs_keep_every_batch_within_twice_the_target() -> None:
    """SQLite checkpoints its WAL on some commits only: every other batch costs more."""
    sweep = _sweep()
    calls = iter(range(1_000))

    def seconds_for(size: int) -> float:
        checkpoint = 0.025 + 15e-6 * size if next(calls) % 2 else 0.0
        return 0.003 + 25e-6 * size + checkpoint

    history = _drive(sweep, seconds_for, 60)
    assert max(elapsed for _, elapsed in history) <= 0.075  # within the target itself
    sizes = [size for size, _ in history[10:]]
    assert max(sizes) <= 2 * min(sizes)  # no wild swings


def test_sizes_stay_within_one_and_batch_size() -> None:
    sweep = _sweep(batch_size=500)
    history = _drive(sweep, lambda size: 1e-6 * size, 10)
    assert max(size for size, _ in history) == 500
    assert sweep.next_size(500, 500, 1000.0) == 1
    assert _sweep().next_size(1, 1, 0.0) == 2  # a batch too fast to measure doubles


# ------------------------------------------------------------ on a database ---


def _seed(projection: RunProjection, count: int) -> None:
    for index in range(count):
        run_id = f"old-{index:03d}"
        projection.insert_start(RunStart(run_id, "repo", "wf", "T", run_id), T0)
        projection.update_node(run_id, RunState.RUNNING, "build", "v")
        projection.record_processed_report(run_id, "v", "rep")
        projection.update_state(run_id, RunState.COMPLETED, None, T0)


def test_the_time_of_a_batch_includes_its_commit(
    projection: RunProjection, observed_engine: Engine
) -> None:
    """The executor commits after the batch's statements; a slow commit (SQLite runs
    WAL checkpoints there) holds the lock as long, so it must shrink the next batch."""
    _seed(projection, 30)
    slow = {"commits": 0}

    def commit(_conn: Any) -> None:
        slow["commits"] += 1
        if slow["commits"] == 1:
            time.sleep(0.4)

    sa.event.listen(observed_engine, "commit", commit)
    try:
        batches = list(
            projection.sweep_retention_batches(CUTOFF, batch_size=10, target_batch_seconds=0.2)
        )
    finally:
        sa.event.remove(observed_engine, "commit", commit)
    # 10 runs in 0.4 s or a little more: the next batch is sized for 70% of 0.2 s,
    # i.e. at most 3 runs (the statements alone take a few ms: without the commit
    # batches would have stayed at 10).
    assert len(batches[0]) == 10
    assert 1 <= len(batches[1]) <= 3
    assert sum(len(batch) for batch in batches) == 30


def test_every_table_that_refers_to_runs_is_swept_explicitly() -> None:
    """SQLite sweeps delete child rows table by table (with foreign keys off for the
    batch): RUN_CHILD_TABLES must name every table with a foreign key to relay_runs."""
    referring = {
        table.name
        for table in metadata.tables.values()
        for key in table.foreign_keys
        if key.column.table is runs
    }
    assert referring == {table.name for table in RUN_CHILD_TABLES}


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    path = tmp_path / "projection.db"
    upgrade(path)
    return path


def _children(engine: Engine) -> int:
    with engine.connect() as connection:
        return sum(
            connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for table in RUN_CHILD_TABLES
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda path: build_engine(resolve_target(path), foreign_keys=False),
        lambda path: sa.create_engine(f"sqlite:///{path}"),
    ],
    ids=["foreign_keys-off", "plain-sqlalchemy-engine"],
)
def test_a_sqlite_connection_without_foreign_keys_still_sweeps_children(
    sqlite_db: Path, make: Any
) -> None:
    seeding = create_engine(sqlite_db)
    _seed(RunProjection(seeding), 5)
    seeding.dispose()
    engine: Engine = make(sqlite_db)
    assert _foreign_keys(engine) == 0
    try:
        assert len(RunProjection(engine).sweep_retention(CUTOFF)) == 5
        assert _children(engine) == 0
        assert _foreign_keys(engine) == 0
    finally:
        engine.dispose()


@pytest.fixture
def single_connection_engine(sqlite_db: Path) -> Iterator[Engine]:
    engine = create_engine(sqlite_db, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _foreign_keys(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.exec_driver_sql("PRAGMA foreign_keys").scalar_one())


def test_the_sweep_turns_foreign_keys_back_on_after_each_batch(
    single_connection_engine: Engine,
) -> None:
    engine = single_connection_engine
    projection = RunProjection(engine)
    _seed(projection, 7)
    seen: list[int] = []

    def before(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("DELETE FROM relay_runs"):
            seen.append(conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one())

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        assert len(projection.sweep_retention(CUTOFF, batch_size=3)) == 7
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
    assert seen == [0, 0, 0]  # off while the batches delete
    assert _foreign_keys(engine) == 1  # on again for every other caller of the pool
    # ... and enforced: a child row of a missing run is refused.
    with pytest.raises(Exception, match="not found"):
        projection.record_processed_report("no-such-run", "v", "rep")


def test_a_failed_batch_turns_foreign_keys_back_on(single_connection_engine: Engine) -> None:
    engine = single_connection_engine
    projection = RunProjection(engine)
    _seed(projection, 3)

    def fail(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("DELETE FROM relay_runs"):
            raise RuntimeError("batch dies")

    sa.event.listen(engine, "before_cursor_execute", fail)
    try:
        with pytest.raises(RuntimeError, match="batch dies"):
            projection.sweep_retention(CUTOFF)
    finally:
        sa.event.remove(engine, "before_cursor_execute", fail)
    assert _foreign_keys(engine) == 1
    assert len(projection.list_runs()) == 3  # rolled back: nothing deleted


def test_a_connection_whose_foreign_keys_cannot_be_restored_is_discarded(
    single_connection_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = single_connection_engine
    projection = RunProjection(engine)
    _seed(projection, 3)
    with engine.connect() as connection:
        before = connection.connection.dbapi_connection
    monkeypatch.setattr(
        execution_module, "FOREIGN_KEYS_ON", "PRAGMA foreign_keys = ON ;;; nonsense"
    )
    assert len(projection.sweep_retention(CUTOFF)) == 3
    monkeypatch.undo()
    with engine.connect() as connection:
        assert connection.connection.dbapi_connection is not before  # a fresh connection
    assert _foreign_keys(engine) == 1
