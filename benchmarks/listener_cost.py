"""Where the sync layer's remaining cost over bare Core goes on SQLite (issue 21).

``get_run`` in a loop, CPU time per call (``time.process_time``), on one SQLite
file at head, three ways taking turns:

* ``layer``: ``RunProjection.get_run`` (the connection of the previous call is
  reused: held_connection.py);
* ``bare Core``: benchmarks/bare_core.py on its held reader (no listeners);
* ``bare Core + listener``: the same with one no-op ``begin`` listener on its
  engine -- the price of any engine listener: SQLAlchemy then dispatches
  connection events around every statement. The layer's SQLite engine needs
  one (``BEGIN IMMEDIATE``: engine.py), so this is the floor it can reach.

    .venv/bin/python -m benchmarks.listener_cost [--calls 4000] [--rounds 4]

Reports; never gates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy

from relay_flow_projection import RunProjection, RunStart, create_engine, upgrade

from .bare_core import BareCore


def _per_call_us(call: Callable[[str], object], calls: int) -> float:
    started = time.process_time_ns()
    for _ in range(calls):
        call("r1")
    return (time.process_time_ns() - started) / calls / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "projection.db")
        upgrade(path)
        layer = RunProjection(create_engine(path))
        layer.insert_start(RunStart("r1", "repo", "wf", "t", "k"), datetime.now(UTC))
        bare = BareCore(path)
        listened = BareCore(path)
        sqlalchemy.event.listen(listened.engine, "begin", lambda _conn: None)
        cases = {
            "layer": layer.get_run,
            "bare Core": bare.get_run,
            "bare Core + listener": listened.get_run,
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, call in cases.items():
                results[name].append(_per_call_us(call, args.calls))
        layer.close()
        layer.engine.dispose()
        bare.close()
        listened.close()
    floor = statistics.median(results["bare Core"])
    print(f"SQLite get_run, CPU µs per call, median of {args.rounds} rounds of {args.calls}:")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"  {name:<22} {median:6.1f} µs  ({median / floor:.2f}x bare Core)")


if __name__ == "__main__":
    main()
