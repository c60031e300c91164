"""Reading runs: ``status``, ``runs list``, ``runs show``. All open the database read-only."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import click

from ..models import RunFilter, RunState
from .access import projection_at_head, require_head
from .jsonview import echo_json, identity_json, node_runtime_json, run_json, state_counts_json
from .options import Settings, db_option, json_option, pass_settings
from .textview import cell, identity_text, key_values, run_line, table, when

if TYPE_CHECKING:
    from ..models import Run
    from ..repository import RunProjection

DEFAULT_LIMIT = 100
# Rows fetched per query by `runs list --all`, and scanned per query when
# --state narrows the rows beyond what RunFilter can say.
PAGE_SIZE = 500


@click.command()
@db_option
@json_option
@pass_settings
def status(settings: Settings, as_json: bool) -> None:
    """Revision, executor identity, runs per state and the oldest active run."""
    revision = require_head(settings.target)
    with projection_at_head(settings.target, read_only=True, revision=revision) as projection:
        identity = projection.identity()
        counts = state_counts_json(projection.count_runs())
        oldest = next(iter(projection.list_runs(RunFilter(active=True), limit=1)), None)
    active = sum(n for state, n in counts.items() if not RunState(state).is_terminal)
    if as_json:
        echo_json(
            {
                "database": revision.database,
                "revision": revision.current,
                "head": revision.head,
                "at_head": revision.at_head,
                "identity": identity_json(identity),
                "runs": counts,
                "total_runs": sum(counts.values()),
                "active_runs": active,
                "oldest_active_run": None if oldest is None else run_json(oldest),
            }
        )
        return
    click.echo(
        key_values(
            [
                ("database", revision.database),
                ("revision", f"{revision.current} (head)"),
                ("executor", identity_text(identity)),
                ("runs", f"{sum(counts.values())} ({active} active)"),
                ("oldest active", "none" if oldest is None else run_line(oldest)),
            ]
        )
    )
    click.echo()
    click.echo(table(["STATE", "RUNS"], [(state, n) for state, n in counts.items()]))


@click.group()
def runs() -> None:
    """List and show runs."""


HEADERS = ["ID", "STATE", "REPO", "WORKFLOW", "TICKET", "ATTEMPT", "NODE", "STARTED", "FINISHED"]


def _row(run: Run) -> tuple[object, ...]:
    return (
        run.id,
        run.state.value,
        run.repo,
        run.workflow,
        run.ticket_key,
        run.attempt_id,
        run.current_node,
        when(run.started_at),
        when(run.finished_at),
    )


def _narrowed(wanted: RunFilter, states: frozenset[RunState]) -> RunFilter:
    """*wanted* with ``active`` set when every chosen state is on one side of it."""
    if not states or wanted.active is not None:
        return wanted
    if all(state.is_terminal for state in states):
        return RunFilter(wanted.repo, wanted.workflow, wanted.ticket, active=False)
    if not any(state.is_terminal for state in states):
        return RunFilter(wanted.repo, wanted.workflow, wanted.ticket, active=True)
    return wanted


def _matching(
    projection: RunProjection,
    wanted: RunFilter,
    states: frozenset[RunState],
    after: Run | None,
    page_size: int | None = None,
) -> Iterator[Run]:
    """Every matching run after *after*, in list order, *page_size* (default
    PAGE_SIZE) rows per query: flat memory.

    RunFilter has no state set, so --state is applied here, on pages already
    narrowed by ``active`` where the chosen states allow it.
    """
    query = _narrowed(wanted, states)
    page_size = page_size or PAGE_SIZE
    while True:
        page = projection.list_runs(query, limit=page_size, after=after)
        for run in page:
            if not states or run.state in states:
                yield run
        if len(page) < page_size:
            return
        after = page[-1]


def _total(projection: RunProjection, wanted: RunFilter, states: frozenset[RunState]) -> int:
    """Matching runs in all, from count_runs (per-state counts served by an index)."""
    counts = projection.count_runs(wanted)
    return sum(n for state, n in counts.items() if not states or state in states)


def _count_text(shown: int, total: int) -> str:
    return f"{shown:,} of {total:,} run{'' if total == 1 else 's'}"


@runs.command("list")
@click.option("--repo", help="Only runs of this repository.")
@click.option("--workflow", help="Only runs of this workflow.")
@click.option("--ticket", help="Only runs of this ticket key.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([state.value for state in RunState]),
    help="Only runs in this state (repeat for several).",
)
@click.option(
    "--active/--terminal",
    default=None,
    help="Only runs not yet completed or canceled / only completed or canceled runs.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="At most this many runs (ignored with --all).",
)
@click.option("--after", metavar="ID", help="Only runs after this run (paging).")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Every matching run, fetched and printed a page at a time (flat memory); "
    "for JSON use --jsonl (--all --json is refused).",
)
@click.option(
    "--jsonl",
    is_flag=True,
    help="One JSON object per run per line (the --json run keys), printed as each page "
    "arrives; no total line, and the --after hint (without --all) on stderr.",
)
@db_option
@json_option
@pass_settings
def list_runs(
    settings: Settings,
    repo: str | None,
    workflow: str | None,
    ticket: str | None,
    states: Sequence[str],
    active: bool | None,
    limit: int,
    after: str | None,
    everything: bool,
    jsonl: bool,
    as_json: bool,
) -> None:
    """Runs ordered by start time (then id), oldest first.

    Prints "N of TOTAL runs" after the table, and on stderr the --after to
    page on when more runs follow.

    \b
    Streaming everything (memory stays flat however many runs match):
      runs list --all            the table, a page at a time
      runs list --all --jsonl    JSON lines: one JSON object per run per line
    --json prints one document ({"runs": [...], "next_after", "total"}) of at
    most --limit runs, so --all --json is refused: use --all --jsonl.
    """
    from ..errors import RunNotFound

    if as_json and jsonl:
        raise click.UsageError("--json and --jsonl are exclusive")
    if as_json and everything:
        raise click.UsageError("--all streams: use --jsonl (one JSON object per line)")
    wanted = RunFilter(repo=repo, workflow=workflow, ticket=ticket, active=active)
    chosen = frozenset(RunState(state) for state in states)
    with projection_at_head(settings.target, read_only=True) as projection:
        try:
            after_run = None if after is None else projection.get_run(after)
        except RunNotFound as exc:
            raise RunNotFound(f"--after: {exc}") from exc
        total = _total(projection, wanted, chosen)
        if everything or jsonl:
            matching = _matching(projection, wanted, chosen, after_run)
            _stream(matching, None if everything else limit, jsonl, total)
            return
        # One row more than shown tells whether more runs follow: without
        # --state, one query of limit + 1 rows (up to PAGE_SIZE) usually answers.
        page_size = PAGE_SIZE if chosen else min(limit + 1, PAGE_SIZE)
        matching = _matching(projection, wanted, chosen, after_run, page_size)
        page = [run for _, run in zip(range(limit + 1), matching, strict=False)]
    more = len(page) > limit
    page = page[:limit]
    next_after = page[-1].id if more else None
    if as_json:
        echo_json(
            {"runs": [run_json(run) for run in page], "next_after": next_after, "total": total}
        )
        return
    if not page:
        click.echo(f"no matching runs ({_count_text(0, total)})")
        return
    click.echo(table(HEADERS, [_row(run) for run in page]))
    click.echo(_count_text(len(page), total))
    if next_after is not None:
        click.echo(f"more runs follow: --after {next_after}", err=True)


@runs.command("show")
@click.argument("run_id", metavar="ID")
@db_option
@json_option
@pass_settings
def show_run(settings: Settings, run_id: str, as_json: bool) -> None:
    """One run with its node runtime bindings."""
    with projection_at_head(settings.target, read_only=True) as projection:
        run = projection.get_run(run_id)
        runtimes = projection.list_node_runtimes(run_id)
    if as_json:
        echo_json({**run_json(run), "node_runtimes": [node_runtime_json(r) for r in runtimes]})
        return
    retry = (
        None
        if run.retry is None
        else f"attempt {run.retry.attempt}, next at {when(run.retry.next_retry_at)}: "
        f"{run.retry.last_error}"
    )
    click.echo(
        key_values(
            [
                ("id", run.id),
                ("logical id", run.logical_id),
                ("attempt", run.attempt_id),
                ("repo", run.repo),
                ("workflow", run.workflow),
                ("ticket", f"{run.ticket_key} (id {run.ticket_id})"),
                ("state", run.state.value),
                ("current node", run.current_node),
                ("current visit", run.current_node_visit_id),
                ("last error", run.last_error),
                ("retry", retry),
                ("started", when(run.started_at)),
                ("updated", when(run.updated_at)),
                ("finished", when(run.finished_at)),
            ]
        )
    )
    click.echo()
    if not runtimes:
        click.echo("no node runtimes")
        return
    rows = [
        (r.node, r.node_visit_id, r.terminal_id, r.session_id, when(r.updated_at)) for r in runtimes
    ]
    click.echo(table(["NODE", "VISIT", "TERMINAL", "SESSION", "UPDATED"], rows))


def _stream(matching: Iterator[Run], limit: int | None, jsonl: bool, total: int) -> None:
    """Print runs as they arrive: JSON lines, or table rows aligned on the first page.

    Holds at most one page of rows, however many runs match.
    """
    shown = 0
    last_id: str | None = None
    widths: list[int] | None = None
    batch: list[list[str]] = []
    for run in matching:
        if limit is not None and shown == limit:
            click.echo(f"more runs follow: --after {last_id}", err=True)
            break
        shown += 1
        last_id = run.id
        if jsonl:
            click.echo(json.dumps(run_json(run), ensure_ascii=False))
            continue
        batch.append([cell(value) for value in _row(run)])
        if len(batch) == PAGE_SIZE:
            widths = _echo_rows(batch, widths)
            batch = []
    if not jsonl:
        if batch or widths is None:
            _echo_rows(batch, widths)
        click.echo(_count_text(shown, total))


def _echo_rows(rows: list[list[str]], widths: list[int] | None) -> list[int]:
    """The header and the first page set the column widths; later pages keep them
    (a longer cell widens only its own line)."""
    if widths is None:
        rows = [list(HEADERS), *rows]
        widths = [max(len(row[column]) for row in rows) for column in range(len(HEADERS))]
    click.echo(
        "\n".join(
            "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        )
    )
    return widths
