"""The benchmark driver: prepares fresh databases, runs each section in a child process,
prints one markdown table with SQLite and PostgreSQL side by side.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from relay_flow_projection import upgrade
from relay_flow_projection.migrate import head_revision

from . import mariadb
from . import upgrade as live_upgrade
from .async_suite import measure_async
from .dataset import (
    PostgresDatabases,
    Shape,
    copy_sqlite,
    load_postgres,
    load_sqlite,
    postgres_available,
)
from .sections import Target, proc_status_kib
from .table import Results, render

ROOT = Path(__file__).resolve().parent.parent
DIALECTS = ("sqlite", "postgresql")


@dataclass(frozen=True, slots=True)
class Sizes:
    runs: int
    rounds: int  # alternating blocks per operation: reads
    read_block: int  # calls per block: reads
    write_block: dict[str, int]  # calls per block: writes, per dialect
    # Alternating blocks of writes per dialect: many short ones on PostgreSQL,
    # whose fsync-bound commits drift with the machine's load.
    write_rounds: dict[str, int]
    threads: int
    thread_iterations: int
    repeat: int  # samples per listing measurement
    sweep_batches: tuple[int, ...]  # batch_size caps; the first is the default
    sweep_repeats: int  # fresh copies swept by the layer per batch size; the median is reported
    adoption_runs: tuple[int, ...]
    sweepable: int = 0  # old terminal runs in the sweep's data set; 0: a tenth of the runs


FULL = Sizes(
    runs=1_000_000,
    rounds=15,
    read_block=1_000,
    write_block={"sqlite": 1_000, "postgresql": 25},
    write_rounds={"sqlite": 15, "postgresql": 60},
    threads=8,
    thread_iterations=100,
    repeat=50,
    sweep_batches=(1_000, 10_000),
    sweep_repeats=3,
    adoption_runs=(100_000, 1_000_000),
)
QUICK = Sizes(
    runs=20_000,
    rounds=4,
    read_block=200,
    write_block={"sqlite": 200, "postgresql": 10},
    write_rounds={"sqlite": 4, "postgresql": 6},
    threads=8,
    thread_iterations=10,
    repeat=10,
    sweep_batches=(1_000, 10_000),
    sweep_repeats=1,
    adoption_runs=(2_000, 20_000),
)


def log(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def run_child(section: str, target: Target, **params: Any) -> dict[str, Any]:
    """Run one section in a fresh interpreter; returns its result."""
    request = json.dumps({"section": section, "target": asdict(target), **params})
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.child", request], cwd=ROOT, stdout=output
        )
        process.wait()
        if process.returncode != 0:
            raise RuntimeError(
                f"section {section} on {target.dialect} failed ({process.returncode})"
            )
        output.seek(0)
        lines = output.read().strip().splitlines()
    result: dict[str, Any] = json.loads(lines[-1])
    return result


class Databases:
    """Fresh databases for one dialect: copies of a loaded template, or empty ones."""

    def __init__(self, dialect: str, workdir: Path, postgres: PostgresDatabases) -> None:
        self.dialect = dialect
        self.workdir = workdir
        self.postgres = postgres
        self.template: str | None = None
        self.mixed_template: str | None = None  # Shape(runs, mixed=True): the sweep's
        self.counter = 0

    def load_template(self, shape: Shape) -> None:
        started = time.perf_counter()
        tag = "mixed-template" if shape.mixed else "template"
        if self.dialect == "sqlite":
            path = self.workdir / f"{tag}.db"
            load_sqlite(path, shape)
            name = str(path)
        else:
            name = self.postgres.create(tag.replace("-", "_"))
            load_postgres(self.postgres, name, shape)
        if shape.mixed:
            self.mixed_template = name
        else:
            self.template = name
        log(
            f"{self.dialect}: {tag} of {shape.runs:,} runs loaded in "
            f"{time.perf_counter() - started:.0f} s"
        )

    @contextmanager
    def fresh(self, *, empty: bool = False, mixed: bool = False) -> Iterator[Target]:
        """A new database (a copy of a template, or an empty one upgraded to head)."""
        self.counter += 1
        template = self.mixed_template if mixed else self.template
        if self.dialect == "sqlite":
            path = self.workdir / f"section-{self.counter}.db"
            if empty:
                upgrade(path)
            else:
                assert template is not None
                copy_sqlite(Path(template), path)
            try:
                yield Target("sqlite", str(path), str(path))
            finally:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
            return
        name = self.postgres.create(f"s{self.counter}", None if empty else template)
        if empty:
            upgrade(self.postgres.url(name))
        try:
            yield Target("postgresql", self.postgres.url(name), self.postgres.libpq(name))
        finally:
            self.postgres.drop(name)


# What --sections can choose (all by default).
SECTIONS = (
    "operations",
    "concurrency",
    "listings",
    "sweep",
    "iterate",
    "adoption",
    "async",
    "upgrade",
)


def measure_dialect(
    databases: Databases, sizes: Sizes, results: Results, sections: tuple[str, ...] = SECTIONS
) -> None:
    dialect = databases.dialect
    if {"operations", "listings", "iterate", "async"} & set(sections):
        databases.load_template(Shape(sizes.runs))

    if "operations" in sections:
        with databases.fresh() as target:
            log(f"{dialect}: 1. per-operation cost, layer vs bare Core vs raw driver")
            ops = run_child(
                "operations",
                target,
                runs=sizes.runs,
                rounds=sizes.rounds,
                block=sizes.read_block,
                write_block=sizes.write_block[dialect],
                write_rounds=sizes.write_rounds[dialect],
            )
            results.put(dialect, "operations", ops)
        if dialect == "postgresql":
            with databases.fresh() as target:
                log(f"{dialect}: 1. round trips per call, layer vs bare Core (a counting proxy)")
                results.put(
                    dialect, "round_trips", run_child("round_trips", target, runs=sizes.runs)
                )
    if "concurrency" in sections:
        with databases.fresh(empty=True) as target:
            log(f"{dialect}: 1. {sizes.threads} threads on shared runs")
            shared = run_child(
                "concurrency", target, threads=sizes.threads, iterations=sizes.thread_iterations
            )
            results.put(dialect, "concurrency", shared)
    if "listings" in sections:
        with databases.fresh() as target:
            log(f"{dialect}: 2. listings, keyset pages, counts")
            listed = run_child("listings", target, runs=sizes.runs, repeat=sizes.repeat)
            results.put(dialect, "listings", listed)
    if "sweep" in sections:
        measure_sweep(databases, sizes, results)
    if "iterate" in sections:
        with databases.fresh() as target:
            log(f"{dialect}: 5. iter_runs over every run")
            iterated = run_child("iterate", target, runs=sizes.runs)
            results.put(dialect, "iterate", iterated)
    if "async" in sections:
        measure_async(databases, sizes, results)


def measure_sweep(databases: Databases, sizes: Sizes, results: Results) -> None:
    """3. sweep_retention and the Go algorithm on copies of the mixed data set (sweep.py).

    The Go algorithm runs once with the layer's pragmas (the ratio the target is
    about) and, on SQLite, once with the Go release's own. The layer sweeps
    ``sweep_repeats`` fresh copies per ``batch_size`` cap (the median time is
    reported, and the longest batch of all of them), then once more with an
    archive, which is checked line by line.
    """
    dialect = databases.dialect
    databases.load_template(Shape(sizes.runs, mixed=True, old=sizes.sweepable))
    shape = {"runs": sizes.runs, "old": sizes.sweepable}
    with databases.fresh(mixed=True) as target:
        log(f"{dialect}: 3. the Go algorithm, the layer's connection settings")
        results.put(dialect, "sweep_go", run_child("sweep_go", target, **shape))
    for batch in sizes.sweep_batches:
        sweeps = []
        for repeat in range(sizes.sweep_repeats):
            with databases.fresh(mixed=True) as target:
                log(f"{dialect}: 3. sweep_retention, batch_size={batch} ({repeat + 1})")
                sweeps.append(run_child("sweep_layer", target, **shape, batch_size=batch))
        sweeps.sort(key=lambda sweep: float(sweep["seconds"]))
        median = {
            **sweeps[len(sweeps) // 2],
            "all_seconds": [s["seconds"] for s in sweeps],
            "longest_batch_s": max(float(s["longest_batch_s"]) for s in sweeps),
        }
        results.put(dialect, f"sweep_layer_{batch}", median)
    with databases.fresh(mixed=True) as target:
        log(f"{dialect}: 3. sweep_retention with an archive, then every line checked")
        archived = run_child("sweep_layer", target, **shape, archive=True)
        results.put(dialect, "sweep_archive", archived)
    if dialect == "sqlite":
        with databases.fresh(mixed=True) as target:
            log(f"{dialect}: 3. the Go algorithm, the Go release's own connection settings")
            own = run_child("sweep_go", target, **shape, pragmas="go")
            results.put(dialect, "sweep_go_own", own)


def _legacy_module() -> ModuleType:
    """tests/legacy_databases.py, which builds the Go releases' databases."""
    path = ROOT / "tests" / "legacy_databases.py"
    spec = importlib.util.spec_from_file_location("relay_bench_legacy_databases", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adopt(workdir: Path, runs: int) -> dict[str, Any]:
    """``alembic upgrade head`` (the CLI, in a child process) on a generation-1 file."""
    path = workdir / f"generation-1-{runs}.db"
    _legacy_module().populate_generation_1(path, runs)
    wal = Path(f"{path}-wal")
    environment = {**os.environ, "RELAY_FLOW_DATABASE_URL": f"sqlite:///{path}"}
    alembic = Path(sys.executable).with_name("alembic")
    command = [str(alembic)] if alembic.exists() else [sys.executable, "-m", "alembic"]
    peak_wal = peak_rss = 0
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        process = subprocess.Popen(
            [*command, "upgrade", "head"], cwd=ROOT, env=environment, stdout=output, stderr=output
        )
        while True:
            with suppress(FileNotFoundError, ProcessLookupError):
                peak_rss = max(peak_rss, proc_status_kib("VmHWM", process.pid))
            with suppress(FileNotFoundError):
                peak_wal = max(peak_wal, wal.stat().st_size)
            if process.poll() is not None:
                break
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        if process.returncode != 0:
            output.seek(0)
            raise RuntimeError(f"alembic upgrade head failed:\n{output.read().decode()}")
    connection = sqlite3.connect(path)
    try:
        version = connection.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        counted = connection.execute("SELECT count(*) FROM relay_runs").fetchone()[0]
        unsorted = connection.execute(
            "SELECT count(*) FROM relay_runs WHERE length(started_at) != 32 "
            "OR substr(started_at, 27) != '+00:00' OR logical_run_id IS NULL"
        ).fetchone()[0]
    finally:
        connection.close()
    if version != head_revision() or counted != runs or unsorted:
        raise AssertionError(f"adoption incomplete: {version=} {counted=} {unsorted=}")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return {"runs": runs, "seconds": elapsed, "peak_rss_kib": peak_rss, "peak_wal": peak_wal}


def measure_mariadb(sizes: Sizes) -> str:
    """The MariaDB section (benchmarks/mariadb.py), as markdown."""
    reason = mariadb.unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            raise SystemExit(f"CI=true but MariaDB is unavailable: {reason}")
        log(f"mariadb skipped: {reason}")
        return f"\nMariaDB: not measured ({reason})"
    log(f"mariadb: {sizes.runs:,} runs, layer vs bare Core vs raw PyMySQL, plans, sweep")
    result = mariadb.measure(sizes.runs, sizes.rounds, sizes.read_block)
    return mariadb.render(result)


def measure_live_upgrades(sizes: Sizes, dialect: str, postgres: PostgresDatabases) -> str:
    """The upgrade section (benchmarks/upgrade.py) on the server backends, as markdown."""
    on_postgres = dialect in ("both", "postgresql") and postgres_available() is None
    on_mysql = dialect in ("both", "mysql") and mariadb.unavailable() is None
    if not (on_postgres or on_mysql):
        return "\nUpgrade while writing: not measured (no PostgreSQL or MariaDB server)"
    log(f"upgrade: {sizes.runs:,} runs at earlier revisions, upgraded while writers write")
    try:
        rows = live_upgrade.measure(sizes.runs, postgres if on_postgres else None, on_mysql)
    finally:
        postgres.drop_all()
    return live_upgrade.render(rows)


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description=(
            "relay_flow_projection against bare SQLAlchemy Core and the raw drivers, "
            "SQLite, PostgreSQL and MariaDB."
        ),
    )
    parser.add_argument(
        "--quick", action="store_true", help="20,000 runs and fewer iterations (CI, < 1 minute)"
    )
    parser.add_argument("--runs", type=int, help="override the number of runs")
    parser.add_argument(
        "--sweepable",
        type=int,
        default=0,
        help="old terminal runs in the sweep's data set (default: a tenth of the runs)",
    )
    parser.add_argument(
        "--dialect",
        choices=(*DIALECTS, "mysql", "both"),
        default="both",
        help="default: both (SQLite and PostgreSQL), then the MariaDB section",
    )
    parser.add_argument("--json", type=Path, help="also write the raw measurements here")
    parser.add_argument(
        "--sections",
        type=_sections,
        default=SECTIONS,
        metavar="NAME[,NAME...]",
        help=f"run only these sections (default: all): {', '.join(SECTIONS)}",
    )
    return parser.parse_args(argv)


def _sections(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown or not chosen:
        named = ", ".join(unknown) or "(none)"
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {named}; choose from {', '.join(SECTIONS)}"
        )
    return chosen


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if arguments.quick else FULL
    if arguments.runs or arguments.sweepable:
        runs = arguments.runs or sizes.runs
        sizes = Sizes(**{**asdict(sizes), "runs": runs, "sweepable": arguments.sweepable})
    dialects: tuple[str, ...] = DIALECTS if arguments.dialect == "both" else (arguments.dialect,)
    dialects = tuple(d for d in dialects if d != "mysql")
    results = Results(
        sizes.runs, quick=arguments.quick, sizes=asdict(sizes), load_before=os.getloadavg()[0]
    )
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="relay_bench_"))
    postgres = PostgresDatabases()
    try:
        for dialect in dialects:
            if dialect == "postgresql":
                reason = postgres_available()
                results.postgres_version = postgres.server_version() if reason is None else ""
                if reason is not None:
                    if os.environ.get("CI", "").lower() == "true":
                        raise SystemExit(f"CI=true but PostgreSQL is unavailable: {reason}")
                    log(f"postgresql skipped: {reason}")
                    results.unavailable["postgresql"] = reason
                    continue
            measure_dialect(
                Databases(dialect, workdir, postgres), sizes, results, arguments.sections
            )
            if dialect == "sqlite" and "adoption" in arguments.sections:
                for runs in sizes.adoption_runs:
                    log(f"sqlite: 4. alembic upgrade head adopting {runs:,} generation-1 runs")
                    results.adoption.append(adopt(workdir, runs))
    finally:
        postgres.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    mysql = ""
    if arguments.dialect in ("both", "mysql"):
        mysql = measure_mariadb(sizes)
    if "upgrade" in arguments.sections:
        mysql += measure_live_upgrades(sizes, arguments.dialect, postgres)
    results.total_seconds = time.perf_counter() - started
    table = render(results)
    sys.stdout.write(table + "\n" + mysql + "\n")
    if arguments.json:
        arguments.json.write_text(json.dumps(results.as_json(), indent=2))
    return 0
