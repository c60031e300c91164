"""sweep_retention(archive=...): every swept run is archived, as one JSON line, before deletion."""

from __future__ import annotations

import gzip
import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from fakes import FakeClock

from relay_flow_projection import RunProjection, RunStart, RunState


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
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(archive, "rt", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    assert sorted(swept) == ["r0", "r2", "r4", "r6", "r8"]
    assert sorted(line["run"]["id"] for line in lines) == sorted(swept)
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
