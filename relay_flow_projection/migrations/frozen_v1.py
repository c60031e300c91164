"""What revisions 0001-0005 need from outside Alembic, frozen as of 0.3.0.

A revision must do tomorrow exactly what it did the day it shipped, so the
revisions never import live package code (the timestamp column type, the
timestamp parser, the error classes): a change there would silently change
what an old revision does to a database that has not run it yet. Nothing in
this module may change behaviour, ever. A revision that needs something
different gets it from a new ``frozen_v2`` module, leaving this one as it is.

Deliberately a copy, not an import, of ``relay_flow_projection.timestamps``
as it stood when 0004 was written.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic.util import CommandError


def utc_timestamp() -> sa.DateTime:
    """The DDL of the package's timestamp columns: ``DATETIME`` on SQLite,
    ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL (what ``UtcDateTime`` renders)."""
    return sa.DateTime(timezone=True)


def normalize_stored_text(text: str | None) -> str | None:
    """A stored SQLite timestamp, any form relay-flow ever wrote, in the canonical
    fixed-width layout ``YYYY-MM-DD HH:MM:SS.ffffff+00:00`` (text order = time order)."""
    if text is None:
        return None
    return _normalize_utc_text(text) or _to_storage_text(_parse_stored_text(text))


def _to_storage_text(value: datetime) -> str:
    return value.isoformat(sep=" ", timespec="microseconds")


def _parse_stored_text(text: str) -> datetime:
    # Python 3.11's fromisoformat reads Go's layout (nine-digit fractions are
    # truncated, any offset); a value without an offset was written as UTC.
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _normalize_utc_text(text: str) -> str | None:
    """Go's UTC layout made canonical by padding or truncating the fraction, at a
    third of the general path's cost; None for every other form."""
    length = len(text)
    if not (length == 25 or 27 <= length <= 34) or not text.endswith("+00:00"):
        return None
    head = text[:19]
    if not (
        head.isascii()
        and head[4] == head[7] == "-"
        and head[10] == " "
        and head[13] == head[16] == ":"
    ):
        return None
    if length == 25:
        fraction = "000000"
    else:
        digits = text[20:-6]
        if text[19] != "." or not (digits.isascii() and digits.isdigit()):
            return None
        fraction = digits[:6].ljust(6, "0")
    try:
        if datetime.fromisoformat(head).tzinfo is not None:  # validates every field
            return None
    except ValueError:
        return None
    return f"{head}.{fraction}+00:00"


class MigrationRefused(CommandError):
    """A revision refuses to run as called (Alembic's own error: one line on its CLI)."""
