"""Output for people: aligned tables and ``key: value`` blocks."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from ..models import ExecutorIdentity, Run

EMPTY = "-"


def when(value: datetime | None) -> str:
    """``2026-03-01T12:00:00Z`` (UTC, to the second) or ``-``."""
    if value is None:
        return EMPTY
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cell(value: object) -> str:
    """One table cell: no line breaks, ``-`` for nothing."""
    if value is None or value == "":
        return EMPTY
    return " ".join(str(value).split()) or EMPTY


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; trailing blanks trimmed."""
    cells = [list(headers), *([cell(value) for value in row] for row in rows)]
    widths = [max(len(line[column]) for line in cells) for column in range(len(headers))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def key_values(pairs: Sequence[tuple[str, object]]) -> str:
    """``key:  value`` lines with the values aligned."""
    width = max((len(key) for key, _ in pairs), default=0) + 1
    return "\n".join(f"{key + ':':<{width}}  {cell(value)}".rstrip() for key, value in pairs)


def identity_text(identity: ExecutorIdentity | None) -> str:
    """The identity as the library's messages write it (operations.describe_identity):
    ``temporal (address 'temporal:7233', namespace 'prod')``, ``goworkflows``."""
    if identity is None:
        return "none (no executor identity marker)"
    from ..operations import describe_identity

    return describe_identity(identity)


def run_line(run: Run) -> str:
    """A run in one phrase, for summaries such as the oldest active run."""
    return (
        f"{run.id} ({run.state.value}, {run.repo}/{run.workflow}, ticket {run.ticket_key}, "
        f"started {when(run.started_at)})"
    )
