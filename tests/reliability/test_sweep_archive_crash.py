"""An archiving sweep is SIGKILLed at random moments: no run is ever gone from the
database without being in the archive (issue 13).

Before each round the parent adds 1,500 old runs; a child process sweeps them
in batches of 10 with ``archive=`` a plain or a gzip file; the parent kills it
at a random instant (seeded), mostly in the middle of the sweep, then checks,
every time, on both databases:

- every run missing from the database is in the archive (a run may be there
  twice: archived by a batch that was killed before its commit, then again);
- the archive reads whole but for its very end: every line parses, a
  ``.gz`` file is a series of complete gzip members (one per batch), except
  that a kill may have cut the last batch's write short -- the next sweep
  cuts that off before it appends (so at the end the file reads whole);
- each archived line carries the run's child rows.

The next child appends to the same file. At the end one sweep runs to
completion and every run is in the archive.
"""

from __future__ import annotations

import json
import random
import zlib
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
import sqlalchemy as sa
from reliability_support import SPAWN, scaled

from relay_flow_projection import create_engine, open_projection, upgrade
from relay_flow_projection.schema import node_runtime, processed_reports, runs

OLD = datetime(2025, 1, 1, tzinfo=UTC)
CUTOFF = OLD + timedelta(days=1)
RUNS = 1_500  # added before each round
BATCH = 10


def sweeper(target: str, archive: str, ready: Event) -> None:
    """Child: sweep with an archive, batch after batch, until killed."""
    projection = open_projection(target)
    ready.set()
    while True:
        projection.sweep_retention(CUTOFF, batch_size=BATCH, archive=archive)


def _load(target: str, round_: int) -> set[str]:
    engine = create_engine(target)
    ids = [f"old-{round_:02d}-{index:05d}" for index in range(RUNS)]
    with engine.begin() as connection:
        connection.execute(
            runs.insert(),
            [
                {"id": i, "logical_run_id": i, "attempt_id": 1, "repo": "r", "workflow": "w",
                 "ticket_id": "t", "ticket_key": i, "state": "completed", "started_at": OLD,
                 "updated_at": OLD, "finished_at": OLD}
                for i in ids
            ],
        )  # fmt: skip
        connection.execute(
            node_runtime.insert(),
            [{"run_id": i, "node": "n", "node_visit_id": "v", "updated_at": OLD} for i in ids],
        )
        connection.execute(
            processed_reports.insert(),
            [{"run_id": i, "report_id": "p", "node_visit_id": "v", "created_at": OLD} for i in ids],
        )
    engine.dispose()
    return set(ids)


def _archived(path: Path, *, torn_tail: bool = False) -> tuple[list[dict[str, object]], bool]:
    """Every whole line of the archive, and whether its end is torn. With *torn_tail*,
    the end may be part of a line or of a gzip member (a kill cut a batch's write
    short); anything else fails."""
    data = path.read_bytes() if path.exists() else b""
    torn = False
    if path.name.endswith(".gz"):
        text = b""
        while data:
            member = zlib.decompressobj(wbits=31)
            try:
                out = member.decompress(data)
            except zlib.error:
                out = b""
            if not member.eof:  # only the last member may be cut short; it counts for nothing
                assert torn_tail, "a gzip member was cut short"
                assert data.startswith(b"\x1f\x8b"[: len(data)]), "not a member's start"
                torn = True
                break
            text += out
            data = member.unused_data
        data = text
    lines = data.split(b"\n")
    if lines[-1]:
        assert torn_tail, "a torn last line"
        torn = True
    return [json.loads(line) for line in lines[:-1]], torn


def _in_database(target: str) -> set[str]:
    engine = create_engine(target)
    with engine.connect() as connection:
        present = set(connection.execute(sa.select(runs.c.id)).scalars())
    engine.dispose()
    return present


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_killed_archiving_sweep_never_loses_a_run(
    db_url: str, dialect: str, tmp_path: Path, suffix: str
) -> None:
    upgrade(db_url)
    all_runs: set[str] = set()
    archive = tmp_path / f"swept{suffix}"
    rng = random.Random(20260313)
    kills = scaled(8, minimum=5)
    interrupted = torn = 0
    for kill in range(kills):
        all_runs |= _load(db_url, kill)
        ready = SPAWN.Event()
        child = SPAWN.Process(target=sweeper, args=(db_url, str(archive), ready))
        child.start()
        assert ready.wait(timeout=60), "the sweeper never started"
        child.join(timeout=rng.uniform(0.05, 0.4))
        assert child.is_alive(), f"the sweeper died by itself (exit code {child.exitcode})"
        child.kill()  # SIGKILL
        child.join()
        lines, cut_short = _archived(archive, torn_tail=True)  # the next sweep cuts it off
        torn += cut_short
        archived = {str(line["run"]["id"]) for line in lines}  # type: ignore[index]
        present = _in_database(db_url)
        gone = all_runs - present
        assert gone <= archived, f"kill {kill + 1}: {sorted(gone - archived)[:5]} not archived"
        assert all(line["relay_node_runtime"] and line["relay_processed_reports"] for line in lines)
        interrupted += bool(present)
    assert interrupted >= kills // 2, "most kills should land before the sweep is done"

    projection = open_projection(db_url)
    projection.sweep_retention(CUTOFF, archive=archive)
    projection.close()

    lines, _ = _archived(archive)
    archived_ids = [str(line["run"]["id"]) for line in lines]  # type: ignore[index]
    assert _in_database(db_url) == set()
    assert set(archived_ids) == all_runs
    print(
        f"\narchive crash [{dialect}, {suffix}]: {kills} SIGKILLs ({interrupted} in the middle "
        f"of a sweep, {torn} in the middle of writing the archive), {len(all_runs)} runs, "
        f"{len(archived_ids) - len(all_runs)} archived twice, none lost"
    )
