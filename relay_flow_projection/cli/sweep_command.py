"""``sweep``: delete old terminal runs in batches, with a progress bar on a terminal.

Ctrl-C (SIGINT) does not cut a batch short: the first one is noted and the
sweep stops once the batch in flight has committed, then reports how many runs
it swept and exits 130 (the shell's code for "ended by SIGINT"). A second
Ctrl-C stops at once; the batch in flight then rolls back (and, with
``--archive``, may be archived again by the next sweep, never lost).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING

import click

from .durations import Duration, duration_option
from .errors import EXIT_INTERRUPTED
from .jsonview import echo_json, iso
from .options import Settings, db_option, json_option, pass_settings
from .textview import when

if TYPE_CHECKING:
    from ..repository import RunProjection

DEFAULT_BATCH_SIZE = 1000


@dataclass
class Progress:
    """What the sweep has done so far; read by the report however the sweep ended."""

    swept: int = 0
    stop_requested: bool = False
    interrupted: bool = False


@contextmanager
def stop_after_batch(progress: Progress) -> Iterator[None]:
    """The first SIGINT asks the sweep to stop after its batch; the next one raises
    KeyboardInterrupt as usual (the previous handler is back)."""
    previous: Callable[[int, FrameType | None], object] | int | None = None

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        progress.stop_requested = True
        signal.signal(signal.SIGINT, previous or signal.default_int_handler)

    try:
        previous = signal.signal(signal.SIGINT, request_stop)
    except ValueError:  # not the main thread: Ctrl-C stays a KeyboardInterrupt
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous or signal.default_int_handler)


def _sweep(
    projection: RunProjection,
    cutoff: datetime,
    batch_size: int,
    archive: str | None,
    expected: int,
    progress: Progress,
) -> None:
    """Sweep batch after batch until done or asked to stop; a progress bar on stderr
    only when stderr is a terminal. Closing the batches closes the archive."""
    if progress.stop_requested:
        return  # Ctrl-C while counting: nothing opened, nothing swept
    batches = projection.sweep_retention_batches(cutoff, batch_size=batch_size, archive=archive)
    try:
        if expected == 0 or not sys.stderr.isatty():
            _drain(batches, progress, lambda _n: None)
            return
        with click.progressbar(length=expected, label="sweeping", file=sys.stderr) as bar:
            # Runs that finish during the sweep may push the count past the estimate.
            _drain(batches, progress, lambda n: bar.update(min(n, max(expected - bar.pos, 0))))
    finally:
        if isinstance(batches, Generator):
            batches.close()  # stopping early: the archive is closed now, not at exit


def _drain(batches: Iterator[list[str]], progress: Progress, shown: Callable[[int], None]) -> None:
    for batch in batches:  # each batch has committed when it arrives here
        progress.swept += len(batch)
        shown(len(batch))
        if progress.stop_requested:
            return


def _report(
    progress: Progress,
    *,
    dry_run: bool,
    older_than: Duration,
    cutoff: datetime,
    archive: str | None,
    as_json: bool,
) -> None:
    if as_json:
        echo_json(
            {
                "dry_run": dry_run,
                "older_than": older_than.text,
                "cutoff": iso(cutoff),
                "runs": progress.swept,
                "archive": archive,
                "interrupted": progress.interrupted,
            }
        )
        return
    verb = "would sweep" if dry_run else "swept"
    noun = "run" if progress.swept == 1 else "runs"
    line = (
        f"{verb} {progress.swept} {noun} finished before {when(cutoff)} "
        f"(older than {older_than.text})"
    )
    if archive is not None:
        line += f", archived to {archive}"
    if progress.interrupted:
        line = f"interrupted: {line}; run the same command to carry on"
    click.echo(line)


@click.command()
@click.option(
    "--older-than",
    metavar="DURATION",
    callback=duration_option,
    required=True,
    help="Sweep runs that finished longer ago than this (4w, 30d, 12h, 90m).",
)
@click.option("--dry-run", is_flag=True, help="Only count what would be swept.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="At most this many runs deleted per transaction.",
)
@click.option(
    "--archive",
    metavar="FILE",
    type=click.Path(dir_okay=False, writable=True),
    help="Append every swept run, with its child rows, to FILE as JSON lines before "
    "deleting it (gzip when FILE ends in .gz).",
)
@db_option
@json_option
@pass_settings
def sweep(
    settings: Settings,
    older_than: Duration,
    dry_run: bool,
    batch_size: int,
    archive: str | None,
    as_json: bool,
) -> None:
    """Delete completed and canceled runs (and their child rows) older than a duration.

    Active runs are never touched. Each batch commits on its own, so an
    interrupted sweep keeps what it deleted and the next one carries on.
    Ctrl-C stops after the batch in flight, prints how many runs were swept
    and exits 130.
    """
    if dry_run and archive is not None:
        raise click.UsageError("--archive writes what is swept; --dry-run sweeps nothing")
    progress = Progress()
    cutoff = older_than.before(datetime.now(UTC))
    try:
        with stop_after_batch(progress):
            _run(settings.target, cutoff, batch_size, archive, dry_run, progress)
    except KeyboardInterrupt:  # the second Ctrl-C, or one before the handler was in place
        progress.stop_requested = True
    progress.interrupted = progress.stop_requested
    _report(
        progress,
        dry_run=dry_run,
        older_than=older_than,
        cutoff=cutoff,
        archive=archive,
        as_json=as_json,
    )
    if progress.interrupted:
        raise click.exceptions.Exit(EXIT_INTERRUPTED)


def _run(
    target: str,
    cutoff: datetime,
    batch_size: int,
    archive: str | None,
    dry_run: bool,
    progress: Progress,
) -> None:
    from .access import projection_at_head

    with projection_at_head(target) as projection:
        expected = projection.count_sweepable(cutoff)
        if dry_run:
            progress.swept = expected
        else:
            _sweep(projection, cutoff, batch_size, archive, expected, progress)
