"""Reading runs: ``status``, ``runs list``, ``runs show``."""

from __future__ import annotations

import click

from ..errors import RunNotFound
from ..models import RunFilter, RunState
from .access import projection_at_head, require_head
from .jsonview import echo_json, identity_json, node_runtime_json, run_json, state_counts_json
from .options import Settings, db_option, json_option, pass_settings
from .textview import identity_text, key_values, run_line, table, when

DEFAULT_LIMIT = 100


@click.command()
@db_option
@json_option
@pass_settings
def status(settings: Settings, as_json: bool) -> None:
    """Revision, executor identity, runs per state and the oldest active run."""
    revision = require_head(settings.target)
    with projection_at_head(settings.target) as projection:
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


@runs.command("list")
@click.option("--repo", help="Only runs of this repository.")
@click.option("--workflow", help="Only runs of this workflow.")
@click.option("--ticket", help="Only runs of this ticket key.")
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
    help="At most this many runs.",
)
@click.option("--after", metavar="ID", help="Only runs after this run (paging).")
@db_option
@json_option
@pass_settings
def list_runs(
    settings: Settings,
    repo: str | None,
    workflow: str | None,
    ticket: str | None,
    active: bool | None,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """Runs ordered by start time (then id), oldest first."""
    wanted = RunFilter(repo=repo, workflow=workflow, ticket=ticket, active=active)
    with projection_at_head(settings.target) as projection:
        try:
            after_run = None if after is None else projection.get_run(after)
        except RunNotFound as exc:
            raise RunNotFound(f"--after: {exc}") from exc
        page = projection.list_runs(wanted, limit=limit, after=after_run)
    next_after = page[-1].id if len(page) == limit else None
    if as_json:
        echo_json({"runs": [run_json(run) for run in page], "next_after": next_after})
        return
    if not page:
        click.echo("no matching runs")
        return
    rows = [
        (
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
        for run in page
    ]
    headers = [
        "ID",
        "STATE",
        "REPO",
        "WORKFLOW",
        "TICKET",
        "ATTEMPT",
        "NODE",
        "STARTED",
        "FINISHED",
    ]
    click.echo(table(headers, rows))
    if next_after is not None:
        click.echo(f"more runs may follow: --after {next_after}", err=True)


@runs.command("show")
@click.argument("run_id", metavar="ID")
@db_option
@json_option
@pass_settings
def show_run(settings: Settings, run_id: str, as_json: bool) -> None:
    """One run with its node runtime bindings."""
    with projection_at_head(settings.target) as projection:
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
