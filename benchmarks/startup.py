"""Start-up: the CPU time of importing the package, opening a projection and the CLI.

Each case runs in a fresh interpreter, several times; the report is the median
of the child processes' CPU time (user + system, from ``getrusage``), which a
busy machine disturbs less than wall-clock time. Cases:

* ``import``: ``python -c "import relay_flow_projection"``
* ``open``: import, ``open_projection`` of a SQLite file at head, one read, close
* ``status``: ``relay-flow-projection status`` on that file
* ``history``: ``relay-flow-projection history`` (reads no database)

``--pythonpath DIR`` measures another checkout of the package (put first on
``PYTHONPATH``), e.g. the previous release, for a before/after comparison::

    git archive main relay_flow_projection | tar -x -C /tmp/before
    .venv/bin/python -m benchmarks.startup --pythonpath /tmp/before
    .venv/bin/python -m benchmarks.startup

Also reports whether Alembic was loaded by ``open`` (it should not be). Reports;
never gates (tests/test_startup.py holds what is loaded).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = str(Path(sys.executable).with_name("relay-flow-projection"))
OPEN = (
    "import sys\n"
    "from relay_flow_projection import open_projection, RunFilter\n"
    "p = open_projection(sys.argv[1])\n"
    "p.list_runs(RunFilter(), limit=1)\n"
    "p.close()\n"
    "print('alembic' in sys.modules)\n"
)


def _cpu_of(command: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed: {result.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, result.stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per case (median reported)")
    parser.add_argument("--pythonpath", help="measure the package found in this directory")
    args = parser.parse_args(argv)

    env = {k: v for k, v in os.environ.items() if k != "RELAY_FLOW_DATABASE_URL"}
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(args.pythonpath).resolve()), *filter(None, [env.get("PYTHONPATH")])]
        )
    with tempfile.TemporaryDirectory(prefix="relay-startup-") as directory:
        database = str(Path(directory) / "head.db")
        setup = "import sys; from relay_flow_projection import upgrade; upgrade(sys.argv[1])"
        _cpu_of([sys.executable, "-c", setup, database], env, directory)
        cases = {
            "import": [sys.executable, "-c", "import relay_flow_projection"],
            "open": [sys.executable, "-c", OPEN, database],
            "status": [CLI, "--db", database, "status"],
            "history": [CLI, "history"],
        }
        _, loaded = _cpu_of(cases["open"], env, directory)
        which = args.pythonpath or "this checkout"
        print(f"start-up CPU time, median of {args.runs} runs ({which}):")
        for name, command in cases.items():
            _cpu_of(command, env, directory)  # warm the file cache and .pyc files
            times = [_cpu_of(command, env, directory)[0] for _ in range(args.runs)]
            print(f"  {name:<8} {statistics.median(times) * 1000:7.0f} ms")
        print(f"  open loads Alembic: {loaded.strip()}")


if __name__ == "__main__":
    main()
