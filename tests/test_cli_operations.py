"""Operator items of issue 12: Ctrl-C during ``sweep``, ``sweep --archive``, weeks in
durations, ``runs list --all --jsonl`` across pages, and ``current``/``--help``
starting without SQLAlchemy or Alembic."""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from conftest import archived, set_versions
from test_cli import as_json, assert_error, console_script, invoke, ok, process_env, run_ids
from test_query_plans import Planned, planned_runs

from relay_flow_projection import RunFilter, RunProjection, create_engine, upgrade
from relay_flow_projection.cli.durations import parse_duration
from relay_flow_projection.cli.quick_revision import chain, postgresql_connection, sqlite_path
from relay_flow_projection.migrate import head_revision, script_directory
from relay_flow_projection.schema import node_runtime, runs

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def bulk_runs(target: str, terminal: int, active: int = 2) -> None:
    """*terminal* runs completed in 2020 (every third with a node runtime), *active* running.

    One executemany per table: thousands of runs in well under a second.
    """

    def row(index: int, state: str) -> dict[str, Any]:
        return {
            "id": f"run-{index:05d}",
            "logical_run_id": f"run-{index:05d}",
            "attempt_id": 1,
            "repo": "acme/api",
            "workflow": "build",
            "ticket_id": f"id-{index}",
            "ticket_key": f"T-{index}",
            "state": state,
            # Equal start times: paging must order by id within them.
            "started_at": LONG_AGO,
            "updated_at": LONG_AGO,
            "finished_at": LONG_AGO + timedelta(minutes=index) if state == "completed" else None,
        }

    rows = [row(i, "completed") for i in range(terminal)]
    rows += [row(terminal + i, "running") for i in range(active)]
    bindings = [
        {
            "run_id": r["id"],
            "node": "compile",
            "terminal_id": "term",
            "session_id": None,
            "node_visit_id": "v1",
            "updated_at": LONG_AGO,
        }
        for r in rows[::3]
    ]
    engine = create_engine(target)
    try:
        with engine.begin() as connection:
            connection.execute(sa.insert(runs), rows)
            connection.execute(sa.insert(node_runtime), bindings)
    finally:
        engine.dispose()


def run_count(path: Path) -> int:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return int(connection.execute("SELECT count(*) FROM relay_runs").fetchone()[0])
    finally:
        connection.close()


# ------------------------------------------------------- sweep, Ctrl-C ---


@pytest.mark.sqlite_only
def test_ctrl_c_stops_the_sweep_after_its_batch_and_exits_130(tmp_path: Path) -> None:
    target = tmp_path / "projection.db"
    archive = tmp_path / "swept.jsonl.gz"
    ok("--db", str(target), "init")
    bulk_runs(str(target), terminal=3000)
    total = run_count(target)
    command = [
        console_script(),
        "--db",
        str(target),
        "sweep",
        "--older-than",
        "1w",
        "--batch-size",
        "1",
        "--archive",
        str(archive),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=process_env()
    )
    deadline = time.monotonic() + 60
    while run_count(target) == total:  # wait until the sweep is under way
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the sweep never started"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    left = run_count(target)

    assert process.returncode == 130, stderr
    assert stderr == ""  # no "Aborted!", no traceback: the report on stdout is all
    match = re.fullmatch(
        r"interrupted: swept (\d+) runs? finished before \S+Z \(older than 1w\), "
        rf"archived to {re.escape(str(archive))}; run the same command to carry on\n",
        stdout,
    )
    assert match, stdout
    swept = int(match.group(1))
    assert swept == total - left  # the count printed is what was deleted
    assert left > 2  # stopped mid-way: terminal runs remain besides the two active ones
    # Every deleted run was archived once: the batch in flight committed, then the sweep stopped.
    ids = [line["run"]["id"] for line in archived(archive)]
    assert len(ids) == len(set(ids)) == swept

    again = subprocess.run(
        command, capture_output=True, text=True, env=process_env(), check=False, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"swept {left - 2} run")
    assert run_count(target) == 2
    every = [line["run"]["id"] for line in archived(archive)]  # appended: two gzip members
    assert sorted(every) == [f"run-{i:05d}" for i in range(3000)]


def test_ctrl_c_outside_a_sweep_is_one_line_and_exit_130(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(RunProjection, "count_runs", interrupted)
    result = invoke("--db", migrated_url, "runs", "list")
    assert result.exit_code == 130
    assert result.stderr == "relay-flow-projection: interrupted\n"


def test_ctrl_c_while_counting_sweeps_nothing_and_exits_130(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bulk_runs(migrated_url, terminal=5)

    def interrupted(*_args: Any, **_kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(RunProjection, "count_sweepable", interrupted)
    result = invoke("--db", migrated_url, "sweep", "--older-than", "1d")
    assert result.exit_code == 130
    assert result.stdout.startswith("interrupted: swept 0 runs finished before ")
    assert result.stdout.count("\n") == 1
    assert "Aborted" not in result.output
    assert len(run_ids(migrated_url)) == 7


# ------------------------------------------------------ sweep --archive ---


@pytest.mark.parametrize("name", ["swept.jsonl", "swept.jsonl.gz"])
def test_sweep_archive_holds_every_swept_run(migrated_url: str, tmp_path: Path, name: str) -> None:
    bulk_runs(migrated_url, terminal=25)
    archive = tmp_path / name
    report = as_json(
        "--db", migrated_url, "sweep", "--older-than", "4w", "--batch-size", "4",
        "--archive", str(archive),
    )  # fmt: skip
    assert report["runs"] == 25
    assert report["archive"] == str(archive)
    assert report["interrupted"] is False
    if name.endswith(".gz"):
        assert archive.read_bytes()[:2] == b"\x1f\x8b"
    else:
        assert archive.read_bytes()[:1] == b"{"
    lines = archived(archive)
    assert sorted(line["run"]["id"] for line in lines) == [f"run-{i:05d}" for i in range(25)]
    for line in lines:
        assert set(line) == {"run", "relay_node_runtime", "relay_node_sessions",
                             "relay_processed_reports"}  # fmt: skip
        assert line["run"]["state"] == "completed"
        assert datetime.fromisoformat(line["run"]["finished_at"]) < LONG_AGO + timedelta(days=1)
    bound = next(line for line in lines if line["run"]["id"] == "run-00003")
    assert [row["node"] for row in bound["relay_node_runtime"]] == ["compile"]
    assert run_ids(migrated_url) == ["run-00025", "run-00026"]  # the active runs stay

    text = ok("--db", migrated_url, "sweep", "--older-than", "1d", "--archive", str(archive))
    assert text.stdout.startswith("swept 0 runs finished before ")
    assert text.stdout.rstrip().endswith(f"(older than 1d), archived to {archive}")
    assert len(archived(archive)) == 25  # appended nothing, still readable


def test_sweep_archive_errors(migrated_url: str, tmp_path: Path) -> None:
    dry = invoke("--db", migrated_url, "sweep", "--older-than", "1d", "--dry-run",
                 "--archive", str(tmp_path / "a.jsonl"))  # fmt: skip
    assert_error(dry, 2, "--dry-run")
    folder = invoke("--db", migrated_url, "sweep", "--older-than", "1d", "--archive", str(tmp_path))
    assert_error(folder, 2, "--archive")
    missing = tmp_path / "no" / "such" / "dir" / "a.jsonl"
    result = invoke("--db", migrated_url, "sweep", "--older-than", "1d", "--archive", str(missing))
    assert_error(result, 1, str(missing))


# ------------------------------------------------------------ durations ---


@pytest.mark.parametrize(
    ("text", "delta"),
    [("1w", timedelta(weeks=1)), ("4W", timedelta(days=28)), ("52w", timedelta(weeks=52))],
)
def test_durations_take_weeks(text: str, delta: timedelta) -> None:
    assert parse_duration(text).delta == delta
    assert parse_duration(text).text == text.lower()


def test_sweep_older_than_weeks(migrated_url: str) -> None:
    bulk_runs(migrated_url, terminal=3)
    report = as_json("--db", migrated_url, "sweep", "--older-than", "2w", "--dry-run")
    assert report["older_than"] == "2w"
    assert report["runs"] == 3
    cutoff = datetime.fromisoformat(report["cutoff"].replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - timedelta(weeks=2) - cutoff) < timedelta(minutes=5)
    assert_error(invoke("--db", migrated_url, "sweep", "--older-than", "2y"), 2, "w, d, h or m")


# ---------------------------------------------------- runs list --all ---


def test_runs_list_all_jsonl_crosses_pages_in_order(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relay_flow_projection.cli import run_commands

    monkeypatch.setattr(run_commands, "PAGE_SIZE", 7)
    bulk_runs(migrated_url, terminal=40, active=10)
    lines = ok("--db", migrated_url, "runs", "list", "--all", "--jsonl").stdout.splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert ids == [f"run-{i:05d}" for i in range(50)]  # same start time: by id, none twice
    active = ok("--db", migrated_url, "runs", "list", "--all", "--jsonl", "--state", "running")
    assert [json.loads(x)["id"] for x in active.stdout.splitlines()] == ids[40:]
    assert active.stderr == ""  # no hint, no total: stdout is pure JSON lines


def test_runs_list_help_says_how_all_streams_json() -> None:
    text = CliRunner().invoke(run_commands_group(), ["list", "--help"]).output
    flat = " ".join(text.split())
    assert "--jsonl" in flat
    assert "one JSON object per run per line" in flat
    assert "--all --json is refused" in flat


def run_commands_group() -> Any:
    from relay_flow_projection.cli.run_commands import runs as group

    return group


PEAK_MEMORY = """
import contextlib, os, sys, tracemalloc
from relay_flow_projection.cli import cli
import relay_flow_projection.cli.run_commands, relay_flow_projection.database  # loaded first
tracemalloc.start()
with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
    try:
        cli.main(sys.argv[1:], prog_name="relay-flow-projection")
    except SystemExit as exc:
        assert not exc.code, exc.code
print(tracemalloc.get_traced_memory()[1])
"""


def _peak_memory(target: str, *args: str) -> int:
    """Peak Python memory of `runs list ... ARGS` in a process of its own, output discarded."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY, "--db", target, "runs", "list", *args],
        capture_output=True, text=True, env=process_env(), check=True, timeout=300,
    )  # fmt: skip
    return int(done.stdout)


def test_runs_list_all_keeps_memory_flat(
    db_url: str, dialect: str, postgres_schemas: Any, mysql_databases: Any
) -> None:
    """Ten times the runs, the same peak: --all holds one page, however many runs match.
    (Holding every run would take megabytes more: about 1 kB per run.)"""
    large = {
        "postgresql": postgres_schemas.new_url,
        "mysql": mysql_databases.new_url,
        "sqlite": lambda: f"{db_url}.large",
    }[dialect]()
    small = db_url
    for target, count in ((small, 1_500), (large, 15_000)):
        upgrade(target)
        bulk_runs(target, terminal=count)
    for mode in ([], ["--jsonl"]):
        grown = _peak_memory(large, "--all", *mode) - _peak_memory(small, "--all", *mode)
        assert grown < 1_000_000, (mode, grown)


@pytest.mark.sqlite_only
def test_runs_list_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`runs list --all | head -1`: no error line and no traceback when the reader goes."""
    target = str(tmp_path / "projection.db")
    upgrade(target)
    bulk_runs(target, terminal=3_000)  # far more than a pipe buffer holds
    for mode in ([], ["--jsonl"]):
        process = subprocess.Popen(
            [console_script(), "--db", target, "runs", "list", "--all", *mode],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=process_env(),
        )  # fmt: skip
        assert process.stdout is not None
        assert process.stderr is not None
        process.stdout.readline()
        process.stdout.close()
        stderr = process.stderr.read()
        process.stderr.close()
        assert process.wait(timeout=60) == 0  # the reader has what it wanted: not an error
        assert stderr == b"", stderr


def test_runs_list_total_is_one_count_query(
    seeded_runs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The total comes from count_runs (per-state counts, which an index answers: see
    test_the_total_never_scans_the_table), and the page from one query of limit + 1."""
    counted: list[RunFilter | None] = []
    listed: list[int | None] = []
    count_runs, list_runs = RunProjection.count_runs, RunProjection.list_runs

    def count_spy(self: RunProjection, filter: RunFilter | None = None) -> Any:
        counted.append(filter)
        return count_runs(self, filter)

    def list_spy(self: RunProjection, *args: Any, **kwargs: Any) -> Any:
        listed.append(kwargs.get("limit"))
        return list_runs(self, *args, **kwargs)

    monkeypatch.setattr(RunProjection, "count_runs", count_spy)
    monkeypatch.setattr(RunProjection, "list_runs", list_spy)
    text = ok("--db", seeded_runs, "runs", "list", "--repo", "acme/api", "--limit", "10")
    assert text.stdout.splitlines()[-1] == "10 of 60 runs"
    assert counted == [RunFilter(repo="acme/api")]
    assert listed == [11]
    assert text.stderr == "more runs follow: --after run-00009\n"


@pytest.fixture
def seeded_runs(migrated_url: str) -> str:
    bulk_runs(migrated_url, terminal=58)
    return migrated_url


COUNT_FILTERS = [
    RunFilter(repo=repo, workflow=workflow, ticket=ticket, active=active)
    for repo, workflow, ticket in [
        (None, None, None),
        ("repo-1", None, None),
        (None, "wf-1", None),
        (None, None, "KEY-1"),
        ("repo-1", "wf-1", None),
    ]
    for active in (None, True, False)
]


@pytest.mark.parametrize(
    "run_filter",
    COUNT_FILTERS,
    ids=lambda f: (
        "-".join(
            f"{name}={getattr(f, name)}"
            for name in ("repo", "workflow", "ticket", "active")
            if getattr(f, name) is not None
        )
        or "all"
    ),
)
def test_the_total_never_scans_the_table(planned: Planned, run_filter: RunFilter) -> None:
    """Every filter `runs list` can give count_runs (--state narrows to --active or
    --terminal) is answered from an index: on SQLite no plain table scan, on
    PostgreSQL (sequential scans disabled) no Seq Scan."""
    for plan in planned.plans(lambda projection: projection.count_runs(run_filter)):
        text = "\n".join(plan)
        if planned.dialect == "sqlite":
            scans = [line for line in plan if line.startswith("SCAN relay_runs")]
            assert all(" USING " in line and "INDEX" in line for line in scans), text
        else:
            assert "Seq Scan" not in text, text


@pytest.fixture
def planned(migrated_url: str, dialect: str) -> Iterator[Planned]:
    """test_query_plans' recording projection on its 3,000 runs, analyzed."""
    yield from planned_runs(migrated_url, dialect, analyze_sqlite=True)


# -------------------------------------------------------- start-up cost ---

PROBE = """
import json, sys
from relay_flow_projection.cli import cli
try:
    cli.main(sys.argv[1:], prog_name="relay-flow-projection")
except SystemExit as exc:
    code = exc.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"sqlalchemy", "alembic"})
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


def probe(*args: str) -> tuple[str, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        env=process_env(),
        check=False,
    )
    return done.stdout, json.loads(done.stderr.splitlines()[-1])


@pytest.mark.sqlite_only
def test_help_and_current_import_neither_sqlalchemy_nor_alembic(tmp_path: Path) -> None:
    assert probe("--help")[1] == {"code": 0, "heavy": []}
    target = tmp_path / "projection.db"
    ok("--db", str(target), "init")
    out, seen = probe("--db", str(target), "current")
    assert seen == {"code": 0, "heavy": []}
    assert out == f"{target}: {head_revision()} (head)\n"
    out, seen = probe("--db", f"sqlite:///{target}", "current", "--json")
    assert seen == {"code": 0, "heavy": []}
    assert json.loads(out)["database"] == str(target)
    # Anything unusual takes the full path (and its error messages): SQLAlchemy's,
    # which loads Alembic only when the version row is not the head (revisions.py).
    (tmp_path / "junk.db").write_bytes(b"not a database" * 10)
    _, seen = probe("--db", str(tmp_path / "junk.db"), "current")
    assert seen == {"code": 2, "heavy": ["sqlalchemy"]}
    import relay_flow_projection

    assert "sqlalchemy" not in subprocess.run(
        [sys.executable, "-c", "import sys, relay_flow_projection; print(*sys.modules)"],
        capture_output=True, text=True, check=True, env=process_env(),
    ).stdout.split()  # fmt: skip
    for name in relay_flow_projection.__all__:  # every public name still resolves
        assert getattr(relay_flow_projection, name) is not None


def test_the_quick_chain_is_alembics() -> None:
    script = script_directory()
    assert chain() == (frozenset(r.revision for r in script.walk_revisions()), head_revision())


# --------------------------------- `current` without SQLAlchemy: equivalence ---
#
# quick_revision answers `current` on a plain SQLite file with the standard
# library only, or steps aside for the full path (SQLAlchemy + Alembic). Every
# case below runs `current` and `current --json` both ways, each on a fresh copy
# of the same files, and the two must print the same thing, exit alike and
# leave the same files behind.


def _database(directory: Path, revision: str = "head") -> Path:
    path = directory / "p.db"
    upgrade(str(path), revision)
    return path


def _head(directory: Path) -> None:
    _database(directory)


def _older(directory: Path) -> None:
    _database(directory, "0003_generation_3")


def _downgraded_to_base(directory: Path) -> None:
    from relay_flow_projection.migrate import run_downgrade

    run_downgrade(str(_database(directory)), "base")  # an empty alembic_version table


def _unversioned(directory: Path) -> None:
    with sqlite3.connect(directory / "p.db") as connection:
        connection.execute("CREATE TABLE other (id INTEGER PRIMARY KEY)")
    connection.close()


def _empty_file(directory: Path) -> None:
    (directory / "p.db").write_bytes(b"")


def _missing(directory: Path) -> None:
    pass


def _newer_release(directory: Path) -> None:
    set_versions(str(_database(directory)), "0099_from_the_future")


def _shared_with_another_chain(directory: Path) -> None:
    set_versions(str(_database(directory)), head_revision(), "app_0001")


def _truncated(directory: Path) -> None:
    whole = directory / "whole.db"
    upgrade(str(whole))
    (directory / "p.db").write_bytes(whole.read_bytes()[: 4096 + 100])
    whole.unlink()


def _not_a_database(directory: Path) -> None:
    (directory / "p.db").write_bytes(b"not a database" * 10)


def _wal_of_a_crashed_writer(directory: Path) -> None:
    """The database at head, and a -wal whose committed frame moves it to 0004: what
    a writer that died before its checkpoint leaves (no -shm)."""
    source = directory / "source"
    source.mkdir()
    path = _database(source)
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("UPDATE alembic_version SET version_num = '0004_adopt_legacy_rows'")
    writer.commit()
    for suffix in ("", "-wal"):
        (directory / f"p.db{suffix}").write_bytes(Path(f"{path}{suffix}").read_bytes())
    writer.close()
    for leftover in source.iterdir():
        leftover.unlink()
    source.rmdir()


SCENARIOS = {
    "head": _head,
    "older": _older,
    "downgraded-to-base": _downgraded_to_base,
    "unversioned": _unversioned,
    "empty-file": _empty_file,
    "missing": _missing,
    "newer-release": _newer_release,
    "shared-version-table": _shared_with_another_chain,
    "truncated": _truncated,
    "not-a-database": _not_a_database,
    "wal-of-a-crashed-writer": _wal_of_a_crashed_writer,
}
# Where the quick path must answer by itself (elsewhere it steps aside), and what.
QUICK = {
    "head": "p.db: {head} (head)\n",
    "older": "p.db: 0003_generation_3 (not at head {head})\n",
    "wal-of-a-crashed-writer": "p.db: 0004_adopt_legacy_rows (not at head {head})\n",
}

# What the full path says where the quick one steps aside: (exit code, fragment).
STEPPED_ASIDE = {
    "downgraded-to-base": (0, "p.db: no revision (not initialized"),
    "unversioned": (0, "p.db: no revision (not initialized"),
    "empty-file": (0, "p.db: no revision (not initialized"),
    "missing": (3, "p.db does not exist"),
    "newer-release": (4, "upgrade the relay-flow-projection package"),
    "shared-version-table": (0, " (head)\n"),
    "truncated": (2, "truncated or damaged"),
    "not-a-database": (2, "is not a SQLite database"),
}


def _current_both_ways(
    directory: Path,
    target: str,
    monkeypatch: pytest.MonkeyPatch,
    full_directory: Path | None = None,
) -> tuple[list[tuple[int, str, str]], list[tuple[int, str, str]], bool]:
    """`current` and `current --json` in *directory*, the quick way, then the full way
    (in *full_directory* when given: a copy, so each path's leftovers can be compared).

    The third value: whether the quick path answered (or raised) every time
    instead of stepping aside.
    """
    from relay_flow_projection.cli import quick_revision

    quick = quick_revision.quick_revision
    answered: list[bool] = []

    def spy(given: str) -> tuple[str, str, str] | None:
        try:
            found = quick(given)
        except Exception:
            answered.append(True)
            raise
        answered.append(found is not None)
        return found

    monkeypatch.chdir(directory)

    def outputs() -> list[tuple[int, str, str]]:
        results = [invoke("--db", target, "current", *extra) for extra in ([], ["--json"])]
        return [(r.exit_code, r.stdout, r.stderr) for r in results]

    monkeypatch.setattr(quick_revision, "quick_revision", spy)
    quick_outputs = outputs()
    monkeypatch.setattr(quick_revision, "quick_revision", lambda _target: None)
    if full_directory is not None:
        monkeypatch.chdir(full_directory)
    full_outputs = outputs()
    return quick_outputs, full_outputs, all(answered)


def _listing(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.sqlite_only
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("form", ["path", "url"])
def test_current_prints_the_same_with_and_without_sqlalchemy(
    scenario: str, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = tmp_path / "original"
    original.mkdir()
    SCENARIOS[scenario](original)
    target = "p.db" if form == "path" else "sqlite:///p.db"
    quick_dir, full_dir = tmp_path / "quick", tmp_path / "full"
    shutil.copytree(original, quick_dir)
    shutil.copytree(original, full_dir)

    quick, full, answered = _current_both_ways(quick_dir, target, monkeypatch, full_dir)

    assert quick == full
    assert answered is (scenario in QUICK)
    if scenario in QUICK:
        assert quick[0] == (0, QUICK[scenario].format(head=head_revision()), "")
    else:
        code, fragment = STEPPED_ASIDE[scenario]
        exit_code, stdout, stderr = quick[0]
        assert exit_code == code, quick
        assert fragment in (stdout if code == 0 else stderr), quick
    assert _listing(quick_dir) == _listing(full_dir)  # neither creates more than the other
    if scenario == "missing":
        assert _listing(quick_dir) == []


@pytest.mark.sqlite_only
@pytest.mark.parametrize("held", ["uncheckpointed-wal", "writer-mid-transaction"])
def test_current_agrees_while_another_process_holds_the_database(
    held: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live writer: committed changes still in its -wal are seen by both paths, its
    uncommitted ones by neither, and neither waits for its write lock."""
    path = _database(tmp_path)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE alembic_version SET version_num = '0004_adopt_legacy_rows'")
        if held == "writer-mid-transaction":
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("UPDATE alembic_version SET version_num = '0003_generation_3'")
        quick, full, answered = _current_both_ways(tmp_path, "p.db", monkeypatch)
    finally:
        writer.close()
    assert quick == full
    assert answered
    assert quick[0] == (0, f"p.db: 0004_adopt_legacy_rows (not at head {head_revision()})\n", "")


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("relay.db", Path("relay.db")),
        ("sqlite:///relay.db", Path("relay.db")),
        ("sqlite:////var/lib/relay.db", Path("/var/lib/relay.db")),
        ("sqlite:///relay.db?mode=ro", None),
        ("sqlite:///relay%20x.db", None),
        ("sqlite:///file:relay.db", None),
        ("sqlite://", None),
        ("postgresql+psycopg://u@h/db", None),
        ("", None),
    ],
)
def test_sqlite_path_takes_only_plain_targets(target: str, path: Path | None) -> None:
    assert sqlite_path(target) == path
    if path is not None and "://" in target:
        from relay_flow_projection.engine import resolve_target

        assert resolve_target(target).path == path  # the same file the full path opens


# ------------------------- `current` without SQLAlchemy on PostgreSQL ---
#
# A plain PostgreSQL URL is answered with psycopg alone. The URL it prints and
# the connection arguments it uses are SQLAlchemy's own (first test); the
# scenarios then hold the two paths to the same output, as for SQLite.


@pytest.mark.parametrize(
    "target",
    [
        "postgresql://postgres@127.0.0.1:5432/relay",
        "postgresql+psycopg://postgres@127.0.0.1/relay",
        "postgresql://relay_user:s3cret~x.y@db-1.internal:6432/relay_projection",
        "postgresql://postgres@127.0.0.1:5432/relay?options=-csearch_path%3Dt_1",
        "postgresql://postgres@127.0.0.1:5432/relay?options=-csearch_path%3dt_1",
        "postgresql://postgres@127.0.0.1:5432/relay?options=-c%20search_path%3Dt_1",
    ],
)
def test_the_quick_postgresql_url_is_sqlalchemys(target: str) -> None:
    from relay_flow_projection.engine import (
        DEFAULT_CONNECT_TIMEOUT,
        _postgresql_connect_args,
        resolve_target,
    )

    found = postgresql_connection(target)
    assert found is not None
    shown, arguments = found
    url = resolve_target(target).url
    assert shown == resolve_target(target).describe()
    engine = sa.create_engine(url)  # builds the dialect; connects to nothing
    _, dialect_arguments = engine.dialect.create_connect_args(url)
    expected = _postgresql_connect_args("psycopg", DEFAULT_CONNECT_TIMEOUT, dict(dialect_arguments))
    del expected["context"]  # SQLAlchemy's type adapters: nothing about where to connect
    assert {k: str(v) for k, v in arguments.items() if v is not None} == {
        k: str(v) for k, v in expected.items() if v is not None
    }
    assert arguments["prepare_threshold"] is None is expected["prepare_threshold"]


@pytest.mark.parametrize(
    "target",
    [
        "postgresql+asyncpg://postgres@127.0.0.1/relay",
        "postgresql://postgres@/relay",  # Unix socket
        "postgresql://postgres@127.0.0.1/",
        "postgresql://postgres@127.0.0.1:0/relay",
        "postgresql://postgres@127.0.0.1:05432/relay",
        "postgresql://postgres@127.0.0.1:99999/relay",
        "postgresql://postgres@127.0.0.1:notaport/relay",
        "postgresql://p%40ss@127.0.0.1/relay",
        "postgresql://postgres:p%40ss@127.0.0.1/relay",
        "postgresql://postgres@[::1]/relay",
        "postgresql://postgres@127.0.0.1/re%20lay",
        "postgresql://postgres@127.0.0.1/relay?sslmode=require",
        "postgresql://postgres@127.0.0.1/relay?options=a+b",
        "postgresql://postgres@127.0.0.1/relay?options=%00",
        "postgresql://postgres@127.0.0.1/relay?options=x&options=y",
        "postgres://postgres@127.0.0.1/relay",
    ],
)
def test_other_postgresql_urls_take_the_full_path(target: str) -> None:
    assert postgresql_connection(target) is None


def _pg_versions(url: str, *versions: str) -> None:
    upgrade(url)
    set_versions(url, *versions)


def _pg_downgraded_to_base(url: str) -> None:
    from relay_flow_projection.migrate import run_downgrade

    upgrade(url)
    run_downgrade(url, "base")


PG_SCENARIOS: dict[str, Any] = {
    "head": upgrade,
    "older": lambda url: upgrade(url, "0003_generation_3"),
    "downgraded-to-base": _pg_downgraded_to_base,
    "unversioned": lambda url: None,
    "newer-release": lambda url: _pg_versions(url, "0099_from_the_future"),
    "shared-version-table": lambda url: _pg_versions(url, head_revision(), "app_0001"),
}
# Where the quick path answers by itself: the revision, and whether it is the head.
PG_QUICK = {"head": "(head)", "older": "0003_generation_3 (not at head"}


@pytest.mark.parametrize("scenario", sorted(PG_SCENARIOS))
@pytest.mark.parametrize("password", [False, True], ids=["no-password", "password"])
def test_current_on_postgresql_prints_the_same_with_and_without_sqlalchemy(
    scenario: str,
    password: bool,
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    PG_SCENARIOS[scenario](postgres_url)
    target = (
        postgres_url.replace("postgres@", "postgres:any-password@", 1) if password else postgres_url
    )
    quick, full, answered = _current_both_ways(tmp_path, target, monkeypatch)
    assert quick == full
    assert answered is (scenario in PG_QUICK)
    if scenario in PG_QUICK:
        code, stdout, _ = quick[0]
        assert code == 0, quick
        assert PG_QUICK[scenario] in stdout
        assert ("postgres:***@" in stdout) is password
        assert json.loads(quick[1][1])["database"] == stdout.split(": ")[0]


@pytest.mark.parametrize("unreachable", ["refused", "no-such-database"])
def test_current_on_an_unreachable_postgresql_fails_alike_both_ways(
    unreachable: str, postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = sa.make_url(postgres_url)
    if unreachable == "refused":
        url = url.set(port=1)
    else:
        url = url.set(database=f"relay_no_such_db_{tmp_path.name[-8:]}")
    target = url.render_as_string(hide_password=False)
    quick, full, answered = _current_both_ways(tmp_path, target, monkeypatch)
    assert quick == full
    assert answered  # reported by the quick path itself: one connect, not two
    code, _, stderr = quick[0]
    # A database that does not exist is not an outage: no retry helps (issue 22),
    # so it exits 1; a refused connection is retryable (75, EX_TEMPFAIL).
    if unreachable == "refused":
        assert code == 75, quick
        assert "the database is unavailable" in stderr
    else:
        assert code == 1, quick
        assert "does not exist" in stderr


def test_current_on_postgresql_imports_neither_sqlalchemy_nor_alembic(postgres_url: str) -> None:
    upgrade(postgres_url)
    out, seen = probe("--db", postgres_url, "current")
    assert seen == {"code": 0, "heavy": []}
    assert out.endswith(f": {head_revision()} (head)\n")


MYSQL_SCENARIOS: dict[str, Any] = {
    "head": upgrade,
    "older": lambda url: upgrade(url, "0003_generation_3"),
    "unversioned": lambda url: None,
    "newer-release": lambda url: _pg_versions(url, "0099_from_the_future"),
}


@pytest.mark.parametrize("scenario", sorted(MYSQL_SCENARIOS))
@pytest.mark.parametrize("form", ["mysql+pymysql", "mysql", "mariadb"])
def test_current_on_mysql_prints_the_same_with_and_without_sqlalchemy(
    scenario: str, form: str, mysql_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    MYSQL_SCENARIOS[scenario](mysql_url)
    target = mysql_url.replace("mysql+pymysql", form, 1)
    quick, full, answered = _current_both_ways(tmp_path, target, monkeypatch)
    assert quick == full
    assert answered is (scenario in PG_QUICK)
    if scenario in PG_QUICK:
        code, stdout, _ = quick[0]
        assert code == 0, quick
        assert PG_QUICK[scenario] in stdout
        assert json.loads(quick[1][1])["database"] == stdout.split(": ")[0]


@pytest.mark.parametrize("unreachable", ["refused", "no-such-database"])
def test_current_on_an_unreachable_mysql_fails_alike_both_ways(
    unreachable: str, mysql_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = sa.make_url(mysql_url)
    url = url.set(port=1) if unreachable == "refused" else url.set(database="relay_no_such_db")
    quick, full, answered = _current_both_ways(
        tmp_path, url.render_as_string(hide_password=False), monkeypatch
    )
    assert quick == full
    assert answered  # reported by the quick path itself: one connect, not two
    assert quick[0][0] == (75 if unreachable == "refused" else 1), quick
    expected = "unavailable" if unreachable == "refused" else "does not exist"
    assert expected in quick[0][2]
