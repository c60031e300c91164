"""``sweep``: delete old terminal runs in batches, with a progress bar on a terminal."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click

from ..repository import RunProjection
from .access import projection_at_head
from .durations import Duration, duration_option
from .jsonview import echo_json, iso
from .options import Settings, db_option, json_option, pass_settings
from .textview import when

DEFAULT_BATCH_SIZE = 1000


def _sweep(projection: RunProjection, cutoff: datetime, batch_size: int, expected: int) -> int:
    """Sweep every batch; a progress bar on stderr only when stderr is a terminal."""
    batches = projection.sweep_retention_batches(cutoff, batch_size=batch_size)
    stderr = sys.stderr
    if expected == 0 or not stderr.isatty():
        return sum(len(batch) for batch in batches)
    swept = 0
    with click.progressbar(length=expected, label="sweeping", file=stderr) as bar:
        for batch in batches:
            swept += len(batch)
            # Runs that finish during the sweep may push the count past the estimate.
            bar.update(min(len(batch), max(expected - bar.pos, 0)))
    return swept


@click.command()
@click.option(
    "--older-than",
    metavar="DURATION",
    callback=duration_option,
    required=True,
    help="Sweep runs that finished longer ago than this (30d, 12h, 90m).",
)
@click.option("--dry-run", is_flag=True, help="Only count what would be swept.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Runs deleted per transaction.",
)
@db_option
@json_option
@pass_settings
def sweep(
    settings: Settings, older_than: Duration, dry_run: bool, batch_size: int, as_json: bool
) -> None:
    """Delete completed and canceled runs (and their child rows) older than a duration.

    Active runs are never touched. Each batch commits on its own, so an
    interrupted sweep keeps what it deleted and the next one carries on.
    """
    cutoff = older_than.before(datetime.now(UTC))
    with projection_at_head(settings.target) as projection:
        expected = projection.count_sweepable(cutoff)
        count = expected if dry_run else _sweep(projection, cutoff, batch_size, expected)
    if as_json:
        echo_json(
            {
                "dry_run": dry_run,
                "older_than": older_than.text,
                "cutoff": iso(cutoff),
                "runs": count,
            }
        )
        return
    verb = "would sweep" if dry_run else "swept"
    noun = "run" if count == 1 else "runs"
    click.echo(
        f"{verb} {count} {noun} finished before {when(cutoff)} (older than {older_than.text})"
    )
