"""The one table the benchmark prints: SQLite and PostgreSQL side by side, with targets."""

from __future__ import annotations

import os
import platform
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy

from .async_table import async_notes, async_rows

Data = dict[str, Any]

# (operation, SQLite ratio target, PostgreSQL ratio target)
OPERATION_TARGETS = (
    ("insert_start", 1.5, 1.3),
    ("update_node", 1.5, 1.3),
    ("get_run", 2.0, 1.3),
    ("register_node_session", 1.5, 1.3),
)
LIST_TARGET_MS = 3.0
SWEEP_TARGETS = {"sqlite": 5.0, "postgresql": 20.0}
LONGEST_BATCH_FACTOR = 2.0  # no sweep batch may hold its locks longer than this x its target
ADOPTION_TARGET_S = 20.0
FLAT_GROWTH_MIB = 32.0  # iter_runs: peak over the first page's RSS


@dataclass
class Results:
    runs: int
    quick: bool = False
    data: dict[str, dict[str, Data]] = field(default_factory=dict)
    adoption: list[Data] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    sizes: Data = field(default_factory=dict)
    postgres_version: str = ""
    total_seconds: float = 0.0
    load_before: float = 0.0

    def put(self, dialect: str, section: str, values: Data) -> None:
        self.data.setdefault(dialect, {})[section] = values

    def get(self, dialect: str, section: str) -> Data | None:
        return self.data.get(dialect, {}).get(section)

    def as_json(self) -> Data:
        return {
            "runs": self.runs,
            "quick": self.quick,
            "sizes": self.sizes,
            "data": self.data,
            "adoption": self.adoption,
            "unavailable": self.unavailable,
            "total_seconds": self.total_seconds,
        }


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


class _Table:
    def __init__(self, results: Results) -> None:
        self.results = results
        self.rows: list[tuple[str, str, str, str, str, str]] = []

    def cell(self, dialect: str, section: str, show: Callable[[Data], str]) -> str:
        values = self.results.get(dialect, section)
        if values is None:
            return "unavailable" if dialect in self.results.unavailable else "—"
        return show(values)

    def met(self, section: str, check: Callable[[str, Data], bool | None]) -> str:
        verdicts = []
        for dialect in ("sqlite", "postgresql"):
            values = self.results.get(dialect, section)
            verdict = None if values is None else check(dialect, values)
            verdicts.append("—" if verdict is None else _yes(verdict))
        return " / ".join(verdicts)

    def add(
        self,
        number: str,
        what: str,
        section: str,
        show: Callable[[Data], str],
        target: str = "",
        check: Callable[[str, Data], bool | None] | None = None,
    ) -> None:
        self.rows.append(
            (
                number,
                what,
                self.cell("sqlite", section, show),
                self.cell("postgresql", section, show),
                target,
                self.met(section, check) if check else "",
            )
        )


def show_ratios(o: Data) -> str:
    """layer / bare Core / raw µs, then layer ÷ bare Core and layer ÷ raw."""
    if "bare_us" not in o:
        return f"{o['layer_us']:.1f} / {o['raw_us']:.1f} ({o['ratio']:.2f}x)"
    return (
        f"{o['layer_us']:.1f} / {o['bare_us']:.1f} / {o['raw_us']:.1f} "
        f"({o['bare_ratio']:.2f}x, {o['ratio']:.2f}x)"
    )


def _show_operation(name: str) -> Callable[[Data], str]:
    def show(d: Data) -> str:
        return show_ratios(d[name])

    return show


ROUND_TRIP_DRIVERS = (
    ("psycopg", "psycopg"),
    ("psycopg_async", "psycopg async"),
    ("asyncpg_async", "asyncpg"),
)


def _show_round_trips(name: str) -> Callable[[Data], str]:
    def show(d: Data) -> str:
        return "; ".join(
            f"{label} {d[key][name]['layer']:g} / {d[key][name]['bare']:g}"
            for key, label in ROUND_TRIP_DRIVERS
            if key in d
        )

    return show


def _show_prepared(name: str) -> Callable[[Data], str]:
    def show(d: Data) -> str:
        o = d[name]
        if "raw_prepared_us" not in o:
            return "—"
        return (
            f"{o['raw_us']:.1f} / {o['raw_prepared_us']:.1f} "
            f"({o['raw_us'] / o['raw_prepared_us']:.2f}x)"
        )

    return show


def _check_operation(name: str, targets: dict[str, float]) -> Callable[[str, Data], bool]:
    def check(dialect: str, d: Data) -> bool:
        return bool(d[name]["ratio"] <= targets[dialect])

    return check


def _speedup(
    results: Results, dialect: str, section: str, baseline: str = "sweep_go"
) -> float | None:
    layer = results.get(dialect, section)
    go = results.get(dialect, baseline)
    return None if layer is None or go is None else float(go["seconds"] / layer["seconds"])


def _sweep_ok(d: Data) -> bool:
    """Exactly the sweepable runs and their child rows gone, every active run kept."""
    return bool(
        d["remaining_sweepable"] == 0
        and d.get("active_kept", True)
        and d["children_deleted"] == 3 * d["runs_deleted"]
    )


def _show_sweep(results: Results, section: str) -> Callable[[Data], str]:
    def show(d: Data) -> str:
        runs = ", ".join(f"{s:.1f}" for s in d.get("all_seconds", [d["seconds"]]))
        dialect = next(name for name, data in results.data.items() if data.get(section) is d)
        ratios = [
            f"{speedup:.1f}x {what}"
            for baseline, what in (("sweep_go", "equal pragmas"), ("sweep_go_own", "Go's own"))
            if (speedup := _speedup(results, dialect, section, baseline)) is not None
        ]
        faster = f"; the Go algorithm: {', '.join(ratios)}" if ratios else ""
        checked = "" if _sweep_ok(d) else " **(wrong rows deleted)**"
        return (
            f"{d['seconds']:.1f} s (of {runs}; client CPU {d['cpu_seconds']:.1f} s){faster}; "
            f"{d['runs_deleted']:,} runs, {d['children_deleted']:,} child rows{checked}"
        )

    return show


def _show_batches(d: Data) -> str:
    return (
        f"longest {d['longest_batch_s'] * 1000:.0f} ms (median {d['median_batch_s'] * 1000:.0f} "
        f"ms; {d['batches']} batches of {d['mean_batch_runs']:,.0f} runs on average) for a "
        f"target of {d['target_batch_s'] * 1000:g} ms"
    )


def _check_batches(dialect: str, d: Data) -> bool:
    return bool(d["longest_batch_s"] <= LONGEST_BATCH_FACTOR * d["target_batch_s"])


def _check_sweep(results: Results, section: str) -> Callable[[str, Data], bool | None]:
    def check(dialect: str, d: Data) -> bool | None:
        speedup = _speedup(results, dialect, section)
        return None if speedup is None else speedup >= SWEEP_TARGETS[dialect] and _sweep_ok(d)

    return check


def _plan_ok(plan: str, index: str) -> bool:
    lowered = plan.lower()
    return (
        index in plan and "temp b-tree" not in lowered and "sort" not in lowered.split("using")[0]
    )


def render(results: Results) -> str:
    table = _Table(results)
    runs = results.runs

    for name, sqlite_target, pg_target in OPERATION_TARGETS:
        table.add(
            "1",
            f"`{name}` µs/op: layer / bare Core / raw driver (layer ÷ bare Core, layer ÷ raw)",
            "operations",
            _show_operation(name),
            f"vs raw ≤ {sqlite_target}x / ≤ {pg_target}x",
            _check_operation(name, {"sqlite": sqlite_target, "postgresql": pg_target}),
        )
    for name, _, _ in OPERATION_TARGETS:
        table.add(
            "1",
            f"`{name}` round trips per call: layer / bare Core",
            "round_trips",
            _show_round_trips(name),
        )
    for name, _, _ in OPERATION_TARGETS:
        table.add(
            "1",
            f"`{name}` raw psycopg µs/op: `prepare_threshold=None` (the layer's pooler-safe "
            "default, used in the rows above) / psycopg's default 5 (ratio)",
            "operations",
            _show_prepared(name),
        )
    table.add(
        "1",
        "8 threads x 4 shared runs (update_node, register_node_session, update_state, get_run)",
        "concurrency",
        lambda d: f"{d['errors']} errors in {d['calls']:,} calls ({d['calls_per_s']:,.0f}/s)",
        "0 errors",
        lambda dialect, d: d["errors"] == 0,
    )

    table.add(
        "2",
        f"`list_runs(workflow=…, active=True)` of {runs:,}: layer (raw), rows",
        "listings",
        lambda d: (
            f"{d['list_active_ms']:.2f} ms ({d['list_active_raw_ms']:.2f} ms), "
            f"{d['active_rows']} rows"
        ),
        f"≤ {LIST_TARGET_MS:g} ms (SQLite)",
        lambda dialect, d: d["list_active_ms"] <= LIST_TARGET_MS if dialect == "sqlite" else None,
    )
    table.add(
        "2",
        "… its query plan",
        "listings",
        lambda d: f"`{d['list_active_plan']}`",
        "active_workflow index, no sort / its index",
        lambda dialect, d: (
            _plan_ok(d["list_active_plan"], "relay_runs_active_workflow")
            if dialect == "sqlite"
            else "relay_runs_active_workflow" in d["list_active_plan"]
        ),
    )
    table.add(
        "2",
        "… for contrast: (workflow, state) index, bound states (raw)",
        "listings",
        lambda d: f"{d['list_plain_index_ms']:.2f} ms" if "list_plain_index_ms" in d else "—",
    )
    table.add(
        "2",
        "keyset page `list_runs(limit=100, after=<middle run>)`",
        "listings",
        lambda d: f"{d['page_all_ms']:.2f} ms: `{d['page_all_plan']}`",
        "index, no sort",
        lambda dialect, d: _plan_ok(d["page_all_plan"], "relay_runs_list_order"),
    )
    table.add(
        "2",
        "keyset page of active runs `(workflow, active, limit=20, after=…)`",
        "listings",
        lambda d: f"{d['page_active_ms']:.2f} ms",
        f"≤ {LIST_TARGET_MS:g} ms",
        lambda dialect, d: d["page_active_ms"] <= LIST_TARGET_MS,
    )
    table.add(
        "2",
        "`count_runs(workflow, active)` / `has_active_workflow`",
        "listings",
        lambda d: f"{d['count_active_ms']:.2f} ms / {d['has_active_ms']:.3f} ms",
        f"≤ {LIST_TARGET_MS:g} ms",
        lambda dialect, d: max(d["count_active_ms"], d["has_active_ms"]) <= LIST_TARGET_MS,
    )
    table.add(
        "2",
        "`count_sweepable` (count), plan",
        "listings",
        lambda d: (
            f"{d['count_sweepable_ms']:.1f} ms ({d['count_sweepable']:,}): "
            f"`{d['count_sweepable_plan']}`"
        ),
        "relay_runs_sweepable, no table scan",
        lambda dialect, d: "relay_runs_sweepable" in d["count_sweepable_plan"],
    )

    sweepable = results.sizes.get("sweepable") or runs // 10
    table.add(
        "3",
        "the Go algorithm (one transaction per run) on the raw driver, the layer's pragmas "
        f"(SQLite: synchronous=NORMAL, foreign_keys=ON): {sweepable:,} terminal runs "
        f"(+3 child rows each) among {runs:,}, 10% of them active",
        "sweep_go",
        lambda d: (
            f"{d['seconds']:.1f} s ({d['runs_deleted']:,} runs; client CPU "
            f"{d['cpu_seconds']:.1f} s)"
        ),
    )
    table.add(
        "3",
        "… the Go release's own pragmas (synchronous=FULL, foreign_keys off: SQLite's defaults)",
        "sweep_go_own",
        lambda d: (
            f"{d['seconds']:.1f} s ({d['runs_deleted']:,} runs; client CPU "
            f"{d['cpu_seconds']:.1f} s)"
        ),
    )
    for batch in sorted(
        {int(key.rsplit("_", 1)[1]) for d in results.data.values() for key in d if "layer_" in key}
    ):
        section = f"sweep_layer_{batch}"
        default = " (the default)" if batch == 1000 else ""
        table.add(
            "3",
            f"`sweep_retention(batch_size={batch})`{default}, same data: median time, "
            "speedup over the Go algorithm",
            section,
            _show_sweep(results, section),
            "≥ 5x / ≥ 20x at equal pragmas",
            _check_sweep(results, section),
        )
        table.add(
            "3",
            "… its batches: lock hold from BEGIN to the end of COMMIT (longest of all runs)",
            section,
            _show_batches,
            f"≤ {LONGEST_BATCH_FACTOR:g}x the target",
            _check_batches,
        )
    table.add(
        "3",
        "`sweep_retention(archive=path)`: time; the archive read back, line by line",
        "sweep_archive",
        lambda d: (
            f"{d['seconds']:.1f} s; {d['archive_lines']:,} lines, "
            f"{d['archive_bytes'] / 2**20:.0f} MiB: {d['archive_missing']} missing, "
            f"{d['archive_duplicates']} twice, {d['archive_different']} different, "
            f"{d['archive_unparsable']} unparsable; longest batch "
            f"{d['longest_batch_s'] * 1000:.0f} ms"
        ),
        "every swept run, as stored; JSON lines parse",
        lambda dialect, d: bool(d["archive_ok"]) and _sweep_ok(d),
    )

    for adoption in results.adoption:
        full_size = adoption["runs"] >= 1_000_000
        smallest = results.adoption[0]
        # "Flat": at most 25% (plus a little slack) above the smallest size measured.
        rss_flat = adoption["peak_rss_kib"] <= smallest["peak_rss_kib"] * 1.25 + 8 * 1024
        wal_flat = adoption["peak_wal"] <= smallest["peak_wal"] * 1.25 + 8 * 1024 * 1024
        verdict = (
            f"time {_yes(adoption['seconds'] <= ADOPTION_TARGET_S)}, RSS {_yes(rss_flat)}, "
            f"WAL {_yes(wal_flat)}"
            if full_size and len(results.adoption) > 1
            else ""
        )
        table.rows.append(
            (
                "4",
                f"`alembic upgrade head` adopting {adoption['runs']:,} generation-1 runs",
                (
                    f"{adoption['seconds']:.1f} s, peak RSS {_mib(adoption['peak_rss_kib'])}, "
                    f"peak WAL {adoption['peak_wal'] / 2**20:.1f} MiB"
                ),
                "n/a (Go releases: SQLite only)",
                f"≤ {ADOPTION_TARGET_S:g} s at 1M; RSS, WAL flat" if full_size else "",
                f"{verdict} / —" if verdict else "",
            )
        )

    table.add(
        "5",
        f"`iter_runs()` over {runs:,} runs: peak RSS (after first page), time",
        "iterate",
        lambda d: (
            f"{_mib(d['peak_rss_kib'])} ({_mib(d['baseline_rss_kib'])}), {d['seconds']:.1f} s"
        ),
        f"flat: peak ≤ first page + {FLAT_GROWTH_MIB:g} MiB",
        lambda dialect, d: d["peak_rss_kib"] - d["baseline_rss_kib"] <= FLAT_GROWTH_MIB * 1024,
    )

    table.rows.extend(async_rows(results))

    header = (
        "| # | Measurement | SQLite (WAL, synchronous=NORMAL) | PostgreSQL | "
        "Target (SQLite / PG) | Met (SQLite / PG) |"
    )
    lines = [header, "|---|---|---|---|---|---|"]
    for row in table.rows:
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return "\n".join([_preamble(results), "", *lines, "", _footnote(results)])


def _preamble(results: Results) -> str:
    mode = "--quick" if results.quick else "full"
    postgres = results.postgres_version or "unavailable"
    return (
        f"relay_flow_projection benchmark ({mode}: {results.runs:,} runs) on "
        f"{platform.machine()} x {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"SQLAlchemy {sqlalchemy.__version__}, SQLite {sqlite3.sqlite_version}, "
        f"PostgreSQL {postgres}; total {results.total_seconds:.0f} s; load average "
        f"{results.load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )


def _write_blocks(sizes: Data) -> str:
    rounds, blocks = sizes.get("write_rounds") or {}, sizes.get("write_block") or {}
    return ", ".join(
        f"{rounds.get(dialect)} blocks of {blocks.get(dialect)} ({name})"
        for dialect, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL"))
    )


def _footnote(results: Results) -> str:
    sizes = results.sizes
    notes = [
        f"1: median of blocks taking turns (layer, bare Core, raw; bare Core, raw, layer; …): "
        f"{sizes.get('rounds')} blocks of {sizes.get('read_block')} reads; writes: "
        f"{_write_blocks(sizes)}; after a warm-up; the raw driver sends the layer's exact SQL "
        "(checked statement by statement), with the same pragmas, transactions, timestamp "
        "conversion and row mapping, and on PostgreSQL psycopg's `prepare_threshold=None` as "
        "the layer's engine sets it (psycopg's own default, 5, in its own rows). Bare Core "
        "(benchmarks/bare_core.py): the layer's own Core statements and parameters on "
        "`sqlalchemy.create_engine(url)` with the layer's driver arguments and no listeners, "
        "connections held open (one for writes, one in AUTOCOMMIT for reads), a write one "
        "`with conn.begin():` transaction started as the layer starts it, a read one "
        "`conn.execute`; it also sends the layer's exact SQL (checked). Round trips: client "
        "turns counted by a loopback TCP proxy (benchmarks/round_trips.py), psycopg's BEGIN "
        "and COMMIT included; 20 calls each.",
        "Each section runs in a child process on a fresh database; peak RSS is the child's "
        "VmHWM, sampled every 10 ms (as is the WAL) for the alembic process.",
    ]
    notes.extend(async_notes(results))
    if results.unavailable:
        notes.append(f"Unavailable: {results.unavailable}")
    return "\n".join(notes)
