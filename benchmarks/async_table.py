"""The table rows of sections 6 (asyncio) and 7 (pooler-safe defaults).

``table.render`` appends :func:`async_rows` to its rows and
:func:`async_notes` to its footnotes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .table import Results

Data = dict[str, Any]
Row = tuple[str, str, str, str, str, str]

ASYNC_RATIO_TARGET = 1.5  # AsyncRunProjection / raw async driver, single-row methods
RAW_THROUGHPUT_TARGET = 0.7  # 64 tasks: layer / raw async driver, same number of connections
SYNC_THROUGHPUT_TARGET = 1.0  # 64 tasks: layer / sync facade with 8 threads
STALL_TARGET_MS = 10.0
OPERATIONS = ("insert_start", "update_node", "get_run", "register_node_session")
PG_DRIVERS = ("psycopg", "asyncpg")


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _cell(results: Results, dialect: str, sections: list[str], show: Callable[[], str]) -> str:
    if dialect in results.unavailable:
        return "unavailable"
    if not all(results.get(dialect, section) for section in sections):
        return "—"
    return show()


def _ratio(o: Data) -> str:
    from .table import show_ratios

    return show_ratios(o)


def _section(results: Results, dialect: str, section: str) -> Data:
    data = results.get(dialect, section)
    assert data is not None
    return data


def async_rows(results: Results) -> list[Row]:
    rows: list[Row] = []
    sqlite_ops = ["async_operations_aiosqlite"]
    pg_ops = [f"async_operations_{driver}" for driver in PG_DRIVERS]
    for name in OPERATIONS:

        def sqlite_show(name: str = name) -> str:
            return "aiosqlite " + _ratio(_section(results, "sqlite", sqlite_ops[0])[name])

        def pg_show(name: str = name) -> str:
            return "; ".join(
                f"{driver} " + _ratio(_section(results, "postgresql", section)[name])
                for driver, section in zip(PG_DRIVERS, pg_ops, strict=True)
            )

        def met(dialect: str, sections: list[str], name: str = name) -> str:
            values = [results.get(dialect, section) for section in sections]
            if not all(values):
                return "—"
            return ", ".join(
                _yes(value[name]["ratio"] <= ASYNC_RATIO_TARGET) for value in values if value
            )

        rows.append(
            (
                "6",
                f"`{name}` µs/op, `AsyncRunProjection` / bare Core (`AsyncConnection`) / raw "
                "async driver (layer ÷ bare Core, layer ÷ raw)",
                _cell(results, "sqlite", sqlite_ops, sqlite_show),
                _cell(results, "postgresql", pg_ops, pg_show),
                f"vs raw ≤ {ASYNC_RATIO_TARGET}x",
                f"{met('sqlite', sqlite_ops)} / {met('postgresql', pg_ops)}",
            )
        )
    rows.extend(_concurrency_rows(results))
    rows.extend(_pooler_rows(results))
    return rows


def _concurrency_rows(results: Results) -> list[Row]:
    section = ["async_concurrency"]
    data = results.get("postgresql", "async_concurrency")
    sizes = results.sizes.get("async") or {}
    tasks, pool, threads = sizes.get("tasks"), sizes.get("pool_size"), sizes.get("threads")
    rows: list[Row] = []
    for driver in PG_DRIVERS:

        def show(driver: str = driver) -> str:
            d = _section(results, "postgresql", "async_concurrency")
            rates = d["calls_per_s"]
            return (
                f"{rates[f'layer_{driver}']:,.0f} / {rates[f'raw_{driver}']:,.0f} calls/s "
                f"({d[f'{driver}_vs_raw']:.2f}x); sync facade {rates['sync_threads']:,.0f} "
                f"calls/s ({d[f'{driver}_vs_sync']:.2f}x)"
            )

        met = "— / —"
        if data:
            met = (
                f"— / {_yes(data[f'{driver}_vs_raw'] >= RAW_THROUGHPUT_TARGET)}, "
                f"{_yes(data[f'{driver}_vs_sync'] >= SYNC_THROUGHPUT_TARGET)}"
            )
        rows.append(
            (
                "6",
                f"{tasks} tasks `get_run` + `update_node` on {pool} connections, {driver} "
                f"async: layer / raw async driver (ratio); sync facade with {threads} threads "
                "(ratio)",
                "—",
                _cell(results, "postgresql", section, show),
                f"≥ {RAW_THROUGHPUT_TARGET}x raw, ≥ {SYNC_THROUGHPUT_TARGET:g}x sync",
                met,
            )
        )

    def bare() -> str:
        d = _section(results, "postgresql", "async_concurrency")
        rates = d["calls_per_s"]
        return "; ".join(
            f"{driver} {rates[f'bare_{driver}']:,.0f} calls/s ({d[f'{driver}_bare_vs_raw']:.2f}x "
            f"raw, {rates[f'bare_{driver}'] / rates['sync_threads']:.2f}x sync; the layer "
            f"{d[f'{driver}_vs_bare']:.2f}x it)"
            for driver in PG_DRIVERS
        )

    rows.append(
        (
            "6",
            f"… bare Core, the floor of any layer on SQLAlchemy's asyncio: the same {tasks} "
            f"tasks on {pool} held `AsyncConnection` reader/writer pairs in an "
            "`asyncio.Queue`, no listeners: throughput (÷ raw, ÷ sync facade); the layer ÷ it",
            "—",
            _cell(results, "postgresql", section, bare),
            "",
            "",
        )
    )

    def cpu() -> str:
        used = _section(results, "postgresql", "async_concurrency")["cpu_us_per_call"]
        parts = [
            f"{driver} {used[f'layer_{driver}']:,.0f} / {used[f'raw_{driver}']:,.0f} "
            f"(bare Core {used[f'bare_{driver}']:,.0f})"
            for driver in PG_DRIVERS
        ]
        return "; ".join(parts) + f"; sync facade {used['sync_threads']:,.0f}"

    rows.append(
        (
            "6",
            "… client CPU time per call (µs, the whole process): layer / raw async driver",
            "—",
            _cell(results, "postgresql", section, cpu),
            "",
            "",
        )
    )

    def from_tasks() -> str:
        d = _section(results, "postgresql", "async_concurrency")
        rates, ms = d["calls_per_s"], d["max_stall_ms"]
        ratios = ", ".join(
            f"{driver} {d[f'{driver}_vs_sync_from_tasks']:.2f}x" for driver in PG_DRIVERS
        )
        return (
            f"{rates['sync_from_tasks']:,.0f} calls/s, longest stall "
            f"{ms['sync_from_tasks']:.1f} ms; the async layer: {ratios}"
        )

    rows.append(
        (
            "6",
            f"… the alternative: the same {tasks} tasks awaiting the sync facade on "
            f"{threads} worker threads (`run_in_executor`): throughput, longest stall; the "
            "async layer's throughput ÷ it",
            "—",
            _cell(results, "postgresql", section, from_tasks),
            f"stall ≤ {STALL_TARGET_MS:g} ms",
            "— / "
            + (
                _yes(data["max_stall_ms"]["sync_from_tasks"] <= STALL_TARGET_MS)
                if data and "sync_from_tasks" in data["max_stall_ms"]
                else "—"
            ),
        )
    )

    def stall() -> str:
        ms = _section(results, "postgresql", "async_concurrency")["max_stall_ms"]
        return "; ".join(
            f"{driver} {ms[f'layer_{driver}']:.1f} ms ({ms[f'raw_{driver}']:.1f} ms)"
            for driver in PG_DRIVERS
        )

    stall_met = "— / —"
    if data:
        stall_met = "— / " + ", ".join(
            _yes(data["max_stall_ms"][f"layer_{driver}"] <= STALL_TARGET_MS)
            for driver in PG_DRIVERS
        )
    rows.append(
        (
            "6",
            "… event loop: longest stall of a 1 ms heartbeat task during the layer's runs "
            "(during the raw driver's)",
            "—",
            _cell(results, "postgresql", section, stall),
            f"≤ {STALL_TARGET_MS:g} ms",
            stall_met,
        )
    )
    return rows


def _pooler_rows(results: Results) -> list[Row]:
    rows: list[Row] = []
    for name in OPERATIONS:

        def show(name: str = name) -> str:
            d = _section(results, "postgresql", "pooler_cost")
            parts = []
            for driver, label in (("psycopg", "psycopg (sync)"), ("asyncpg", "asyncpg")):
                o = d[driver][name]
                parts.append(
                    f"{label} {o['default_us']:.1f} / {o['driver_default_us']:.1f} "
                    f"({o['ratio']:.2f}x)"
                )
            return "; ".join(parts)

        rows.append(
            (
                "7",
                f"`{name}` µs/op on a direct connection: pooler-safe default / the driver's "
                "default (ratio)",
                "n/a",
                _cell(results, "postgresql", ["pooler_cost"], show),
                "",
                "",
            )
        )
    return rows


def async_notes(results: Results) -> list[str]:
    sizes = results.sizes.get("async") or {}
    return [
        "6: `AsyncRunProjection` against the raw async drivers (aiosqlite, psycopg's asyncio "
        "mode, asyncpg) sending the same SQL with the same transactions and the same "
        "connection settings (checked at the driver, statement by statement and value by "
        "value, BEGIN/COMMIT included where the driver shows them), blocks as in 1; bare "
        "Core: held `AsyncConnection` objects, one `run_sync` of the sync bare-Core "
        "functions per call (the layer's own way into Core). "
        f"{sizes.get('tasks')} tasks: each loops `get_run` + `update_node` on a run of its own "
        f"for {sizes.get('seconds')} s per round, {sizes.get('rounds')} rounds rotating the "
        "contenders, median calls/s; the layer's engines have "
        f"`pool_size={sizes.get('pool_size')}, max_overflow=0`, the raw drivers an "
        f"`asyncio.Queue` of {sizes.get('pool_size')} connections (bare Core: of "
        f"{sizes.get('pool_size')} held reader/writer pairs), the sync facade "
        f"{sizes.get('threads')} threads on a pool of {sizes.get('pool_size')}; the heap is "
        "collected before each run and what the set-up allocated frozen (`gc.freeze`), so "
        "that one contender's garbage is not collected during the next one's; stall: the "
        "largest delay beyond 1 ms of an `asyncio.sleep(0.001)` loop, over all rounds.",
        "7: the same methods, alternating blocks, with the layer's defaults (psycopg "
        "`prepare_threshold=None`; asyncpg `statement_cache_size=0`, "
        "`prepared_statement_cache_size=0`) against `connect_args` restoring the drivers' own "
        "(`prepare_threshold=5`; `statement_cache_size=100`, "
        "`prepared_statement_cache_size=100`); a ratio above 1 is what the pooler-safe "
        "default costs on a direct connection.",
    ]
