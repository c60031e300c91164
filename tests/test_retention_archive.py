"""sweep_retention(archive=...): every swept run is archived, as one JSON line, before deletion.

The line format is retention.py's module docstring (and README's); an
interrupted sweep never deletes a run that is not in the archive
(tests/reliability/test_sweep_archive_crash.py kills a sweeping process too).
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import zlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import archived
from fakes import FakeClock
from sqlalchemy.engine import Engine

from relay_flow_projection import (
    NodeRuntime,
    NodeSessionRegistration,
    ProjectionError,
    RetryStatus,
    RunProjection,
    RunStart,
    RunState,
)
from relay_flow_projection.schema import RUN_CHILD_TABLES, runs

# Batches of exactly batch_size runs, whatever the machine's speed: a target no
# batch of a test can reach.
FIXED_SIZE = {"target_batch_seconds": 3600.0}


def _seed(projection: RunProjection, clock: FakeClock, count: int) -> None:
    for index in range(count):
        run_id = f"r{index}"
        projection.insert_start(RunStart(run_id, "repo", "wf", "T", run_id), clock.now)
        projection.update_node(run_id, RunState.RUNNING, "build", f"v{index}")
        projection.record_processed_report(run_id, f"v{index}", f"rep{index}")
        state = RunState.COMPLETED if index % 2 == 0 else RunState.RUNNING
        projection.update_state(run_id, state, None, clock.now if state.is_terminal else None)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_every_swept_run_is_in_the_archive(
    projection: RunProjection, clock: FakeClock, tmp_path: Path, suffix: str
) -> None:
    _seed(projection, clock, 9)
    archive = tmp_path / f"swept{suffix}"
    swept = projection.sweep_retention(clock.now + timedelta(days=1), batch_size=2, archive=archive)
    lines = archived(archive)
    assert sorted(swept) == ["r0", "r2", "r4", "r6", "r8"]
    assert sorted(line["run"]["id"] for line in lines) == sorted(swept)
    assert archive.stat().st_mode & 0o777 == 0o600  # private, like the database file
    first = next(line for line in lines if line["run"]["id"] == "r0")
    assert first["run"]["state"] == "completed"
    assert [row["report_id"] for row in first["relay_processed_reports"]] == ["rep0"]
    assert [row["node"] for row in first["relay_node_runtime"]] == ["build"]
    assert len(projection.list_runs()) == 4


def test_a_binary_file_object_is_accepted_and_left_open(
    projection: RunProjection, clock: FakeClock
) -> None:
    _seed(projection, clock, 3)
    buffer = io.BytesIO()
    projection.sweep_retention(clock.now + timedelta(days=1), archive=buffer)
    assert not buffer.closed
    assert len(buffer.getvalue().splitlines()) == 2


def test_a_bad_archive_argument_is_refused_before_anything_is_deleted(
    projection: RunProjection, clock: FakeClock
) -> None:
    _seed(projection, clock, 3)
    with pytest.raises(TypeError, match="archive"):
        projection.sweep_retention(clock.now + timedelta(days=1), archive=42)  # type: ignore[arg-type]
    assert len(projection.list_runs()) == 3


@pytest.mark.parametrize(
    ("archive", "error", "match"),
    [
        ("missing-dir/swept.jsonl", ProjectionError, "cannot open the sweep archive"),
        ("swept-\ud800.jsonl", ValueError, "cannot be encoded"),
    ],
    ids=["unopenable", "lone-surrogate"],
)
def test_an_archive_that_cannot_be_opened_is_refused_before_anything_is_deleted(
    projection: RunProjection,
    clock: FakeClock,
    tmp_path: Path,
    archive: str,
    error: type[Exception],
    match: str,
) -> None:
    _seed(projection, clock, 3)
    with pytest.raises(error, match=match):
        projection.sweep_retention(clock.now + timedelta(days=1), archive=tmp_path / archive)
    assert len(projection.list_runs()) == 3


class _FullDisk(io.RawIOBase):
    """A writable binary file on a full disk."""

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_an_archive_write_failure_deletes_nothing_and_is_not_a_database_error(
    projection: RunProjection, clock: FakeClock
) -> None:
    _seed(projection, clock, 3)
    full_disk: Any = _FullDisk()
    with pytest.raises(ProjectionError, match="No space left") as raised:
        projection.sweep_retention(clock.now + timedelta(days=1), archive=full_disk)
    assert type(raised.value) is ProjectionError  # not DatabaseUnavailable: retrying won't help
    assert len(projection.list_runs()) == 3


class _FailingFlush(io.BytesIO):
    """Takes the bytes, then cannot flush them (a full disk noticed late)."""

    def flush(self) -> None:
        raise OSError(errno.EIO, "Input/output error")


def test_an_archive_flush_failure_deletes_nothing(
    projection: RunProjection, clock: FakeClock
) -> None:
    _seed(projection, clock, 3)
    with pytest.raises(ProjectionError, match="Input/output error"):
        projection.sweep_retention(clock.now + timedelta(days=1), archive=_FailingFlush())
    assert len(projection.list_runs()) == 3


# ------------------------------------------------------------ the line format ---

T0 = datetime(2025, 1, 1, 12, 30, 15, 250000, tzinfo=UTC)


def test_the_line_format(projection: RunProjection, clock: FakeClock) -> None:
    """One JSON object per line: "run" (every relay_runs column) and one list per child
    table (every column, ordered by key), keys sorted, ISO 8601 UTC timestamps."""
    projection.insert_start(RunStart("full", "repo", "wf", "T-1", "KEY-1", "logical", 3), T0)
    projection.update_node("full", RunState.RUNNING, "build", "v1")
    projection.update_node_runtime(NodeRuntime("full", "test", "term", "s-test", "v1"))
    assert projection.register_node_session(NodeSessionRegistration("full", "build", "s-b"))
    projection.record_processed_report("full", "v1", "rep-2")
    projection.record_processed_report("full", "v1", "rep-1")
    projection.update_state("full", RunState.CANCELED, "stopped: ünïcode", T0 + timedelta(hours=1))
    projection.update_retry("full", RetryStatus(2, "flaky", T0 + timedelta(minutes=5)))
    projection.insert_start(RunStart("bare", "repo", "wf", "T-2", "KEY-2"), T0)
    projection.update_state("bare", RunState.COMPLETED, None, T0)
    buffer = io.BytesIO()

    projection.sweep_retention(T0 + timedelta(days=1), archive=buffer)

    data = buffer.getvalue()
    assert data.endswith(b"\n")
    lines = {}
    for raw in data.splitlines():
        assert raw == json.dumps(json.loads(raw), sort_keys=True, ensure_ascii=False).encode()
        line = json.loads(raw)
        lines[line["run"]["id"]] = line
    assert sorted(lines) == ["bare", "full"]
    expected_keys = {"run", *(table.name for table in RUN_CHILD_TABLES)}
    for line in lines.values():
        assert set(line) == expected_keys
        assert set(line["run"]) == set(runs.c.keys())
    full = lines["full"]
    updated = full["run"].pop("updated_at")
    assert datetime.fromisoformat(updated).tzinfo == UTC
    assert full["run"] == {
        "id": "full",
        "logical_run_id": "logical",
        "attempt_id": 3,
        "repo": "repo",
        "workflow": "wf",
        "ticket_id": "T-1",
        "ticket_key": "KEY-1",
        "state": "canceled",
        "current_node": "build",
        "current_node_visit_id": "v1",
        "last_error": "stopped: ünïcode",
        "retry_error": "flaky",
        "retry_attempt": 2,
        "next_retry_at": "2025-01-01T12:35:15.250000+00:00",
        "started_at": "2025-01-01T12:30:15.250000+00:00",
        "finished_at": "2025-01-01T13:30:15.250000+00:00",
    }
    assert [(r["node"], r["terminal_id"], r["session_id"]) for r in full["relay_node_runtime"]] == [
        ("build", None, "s-b"),
        ("test", "term", "s-test"),
    ]
    assert [r["report_id"] for r in full["relay_processed_reports"]] == ["rep-1", "rep-2"]
    assert [(r["node"], r["session_id"]) for r in full["relay_node_sessions"]] == [("build", "s-b")]
    for table in RUN_CHILD_TABLES:
        for row in full[table.name]:
            assert set(row) == set(table.c.keys())
            assert row["run_id"] == "full"
        assert lines["bare"][table.name] == []


def _gzip_members(data: bytes) -> list[bytes]:
    members = []
    while data:
        reader = zlib.decompressobj(wbits=31)
        members.append(reader.decompress(data))
        assert reader.eof, "a gzip member is cut short"
        data = reader.unused_data
    return members


def test_a_gz_archive_is_one_gzip_member_per_batch_and_appends(
    projection: RunProjection, clock: FakeClock, tmp_path: Path
) -> None:
    """Each batch is a whole gzip member: cut between two batches (a kill), the file
    still reads; a later sweep appends members of its own."""
    archive = tmp_path / "swept.jsonl.gz"
    _seed(projection, clock, 9)
    first = projection.sweep_retention(
        clock.now + timedelta(days=1), batch_size=2, archive=archive, **FIXED_SIZE
    )
    members = _gzip_members(archive.read_bytes())
    assert len(members) == 3  # 5 runs in batches of 2
    assert [len(member.splitlines()) for member in members] == [2, 2, 1]
    _seed(projection, clock, 1)  # r0 again
    projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)
    assert _archived_ids(archive) == [*first, "r0"]


# ------------------------------------------------------- interrupted sweeps ---


def _dies_on_second_runs_delete() -> Any:
    """A before_cursor_execute listener: the second ``DELETE FROM relay_runs`` raises."""
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if " ".join(statement.split()).startswith("DELETE FROM relay_runs"):
            seen.append(statement)
            if len(seen) == 2:
                raise RuntimeError("the process dies here")

    return before


def test_a_batch_that_fails_after_archiving_deletes_nothing_and_is_archived_again(
    projection: RunProjection, clock: FakeClock, observed_engine: Engine
) -> None:
    """The second batch dies after its archive lines are written, before its
    commit: its runs stay, and the next sweep archives them a second time."""
    _seed(projection, clock, 9)  # r0, r2, r4, r6, r8 expired
    cutoff = clock.now + timedelta(days=1)
    buffer = io.BytesIO()
    dies = _dies_on_second_runs_delete()
    sa.event.listen(observed_engine, "before_cursor_execute", dies)
    try:
        with pytest.raises(RuntimeError, match="dies here"):
            projection.sweep_retention(cutoff, batch_size=2, archive=buffer, **FIXED_SIZE)
    finally:
        sa.event.remove(observed_engine, "before_cursor_execute", dies)
    archived = Counter(json.loads(raw)["run"]["id"] for raw in buffer.getvalue().splitlines())
    left = {run.id for run in projection.list_runs()}
    deleted = {f"r{i}" for i in range(9)} - left
    assert len(deleted) == 2
    assert sorted(archived) == sorted(deleted | {"r4", "r6"})  # batch 2: archived, kept
    assert {"r4", "r6"} <= left

    swept = projection.sweep_retention(cutoff, archive=buffer)

    archived = Counter(json.loads(raw)["run"]["id"] for raw in buffer.getvalue().splitlines())
    assert sorted(swept) == ["r4", "r6", "r8"]
    assert set(archived) == {"r0", "r2", "r4", "r6", "r8"}
    assert {run_id for run_id, times in archived.items() if times > 1} == {"r4", "r6"}
    assert {run.id for run in projection.list_runs()} == {"r1", "r3", "r5", "r7"}


def test_an_archive_path_is_on_disk_before_its_batch_deletes_anything(
    projection: RunProjection,
    clock: FakeClock,
    observed_engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        real_fsync(descriptor)
        events.append("fsync")

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            events.append("delete")

    monkeypatch.setattr(os, "fsync", fsync)
    sa.event.listen(observed_engine, "before_cursor_execute", before)
    try:
        _seed(projection, clock, 9)
        projection.sweep_retention(
            clock.now + timedelta(days=1),
            batch_size=2,
            archive=tmp_path / "swept.jsonl",
            **FIXED_SIZE,
        )
    finally:
        sa.event.remove(observed_engine, "before_cursor_execute", before)
    steps = [event for i, event in enumerate(events) if i == 0 or events[i - 1] != event]
    assert steps == ["fsync", "delete"] * 3  # each batch: on disk, then deleted


# ------------------------------------------- what an interrupted write leaves ---


def _archived_ids(archive: Path) -> list[str]:
    return [line["run"]["id"] for line in archived(archive)]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_the_next_sweep_cuts_off_a_batch_whose_write_was_cut_short(
    projection: RunProjection, clock: FakeClock, tmp_path: Path, suffix: str
) -> None:
    """A kill in the middle of a batch's write leaves part of a line (or gzip member)
    of a batch that was never deleted; the next sweep cuts it off, then appends."""
    archive = tmp_path / f"swept{suffix}"
    _seed(projection, clock, 3)  # r0, r2 expired
    first = projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)
    whole = archive.read_bytes()
    one_batch = json.dumps({"relay_node_runtime": [], "run": {"id": "r9"}}).encode() + b"\n"
    if suffix.endswith(".gz"):
        one_batch = gzip.compress(one_batch, compresslevel=6)
    for cut in (1, 5, 11, len(one_batch) // 2, len(one_batch) - 1):
        archive.write_bytes(whole + one_batch[:cut])
        _seed(projection, clock, 1)  # r0 again
        projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)
        assert _archived_ids(archive) == [*first, "r0"], cut
        whole = archive.read_bytes()
        first = [*first, "r0"]


@pytest.mark.parametrize(
    ("suffix", "tail"),
    [(".jsonl", b"hand-written note"), (".jsonl.gz", b"\x1f\x8b\x08\x08not ours")],
    ids=["jsonl", "gz"],
)
def test_an_archive_ending_in_something_else_is_refused_before_anything_is_deleted(
    projection: RunProjection, clock: FakeClock, tmp_path: Path, suffix: str, tail: bytes
) -> None:
    archive = tmp_path / f"swept{suffix}"
    archive.write_bytes(tail)
    _seed(projection, clock, 3)
    with pytest.raises(ProjectionError, match=r"truncate -s 0 "):
        projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)
    assert archive.read_bytes() == tail
    assert len(projection.list_runs()) == 3


def test_one_sweep_at_a_time_writes_an_archive(
    projection: RunProjection, clock: FakeClock, tmp_path: Path
) -> None:
    fcntl = pytest.importorskip("fcntl")
    archive = tmp_path / "swept.jsonl"
    _seed(projection, clock, 3)
    with archive.open("ab") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)  # another sweep is writing it
        with pytest.raises(ProjectionError, match="another sweep is writing the archive"):
            projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)
    assert len(projection.list_runs()) == 3
    assert len(projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)) == 2


def test_an_existing_archive_is_made_private_before_it_is_appended_to(
    projection: RunProjection, clock: FakeClock, tmp_path: Path
) -> None:
    _seed(projection, clock, 3)
    archive = tmp_path / "swept.jsonl"
    archive.write_bytes(b"")
    archive.chmod(0o644)
    swept = projection.sweep_retention(clock.now + timedelta(days=1), archive=archive)
    assert sorted(swept) == ["r0", "r2"]
    assert archive.stat().st_mode & 0o777 == 0o600
    assert sorted(line["run"]["id"] for line in archived(archive)) == ["r0", "r2"]
