"""One timestamp column type: aware UTC in, aware UTC out, microsecond precision.

PostgreSQL stores ``TIMESTAMP WITH TIME ZONE``. MySQL and MariaDB store
``DATETIME(6)`` (microseconds; plain ``DATETIME`` truncates to seconds) holding
UTC wall-clock time: ``DATETIME`` has no zone, and ``TIMESTAMP`` would convert
through the session's time zone and ends in 2038. SQLite has no time type, so the
column is declared ``DATETIME`` (as relay-flow's Go releases declared it) and
holds text in one fixed-width layout, ``YYYY-MM-DD HH:MM:SS.ffffff+00:00``:
every stored value has the same offset and width, so text order is time order
and ``ORDER BY`` / ``finished_at < ?`` are correct on the stored text.

Reading accepts every text form older releases wrote (Go's
``2006-01-02 15:04:05.999999999-07:00``: nanoseconds, trimmed fractions, no
fraction, any offset); the adoption migration rewrites such values into the
canonical layout so that they sort.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import types
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect

from .column_types import MYSQL_DIALECTS


def require_aware(value: datetime, what: str = "timestamp") -> datetime:
    """Return *value* as a plain ``datetime`` in UTC; naive or unrepresentable values
    raise ValueError.

    A subclass (pendulum, pandas, one overriding ``isoformat``) comes back as a
    plain ``datetime``: SQLite stores ``isoformat()`` text, and a subclass's own
    text would break the fixed-width layout that ``ORDER BY`` relies on, and
    every later read of the row. The base-class methods are called directly for
    the same reason: a subclass may override them.
    """
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or datetime.utcoffset(value) is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {datetime.isoformat(value)}")
    try:
        utc = datetime.astimezone(value, UTC)
    except OverflowError as exc:
        raise ValueError(
            f"{what} {datetime.isoformat(value)} is outside the representable range"
        ) from exc
    if type(utc) is datetime:
        return utc
    return datetime(
        utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, tzinfo=UTC
    )


def to_storage_text(value: datetime) -> str:
    """Canonical SQLite text for an aware UTC datetime (fixed width, sortable)."""
    return value.isoformat(sep=" ", timespec="microseconds")


def parse_stored_text(text: str) -> datetime:
    """Parse any text form relay-flow ever stored; the result is aware UTC.

    Python 3.11's ``fromisoformat`` reads Go's layout, including nine-digit
    fractions (truncated to microseconds) and ``+05:30`` offsets. A value
    without an offset was written by a UTC-only writer and is read as UTC.
    """
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def normalize_stored_text(text: str | None) -> str | None:
    """Rewrite a stored timestamp into the canonical layout (used by the adoption migration)."""
    if text is None:
        return None
    return _normalize_utc_text(text) or to_storage_text(parse_stored_text(text))


def _normalize_utc_text(text: str) -> str | None:
    """Go's UTC layout ``2006-01-02 15:04:05[.999999999]+00:00`` made canonical by
    padding or truncating the fraction: the result ``parse_stored_text`` would
    give, at a third of its cost (a 1M-run adoption calls this ~3M times).
    None for every other form, which takes the general path."""
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


class _SQLiteDateTimeText(types.UserDefinedType[str]):
    """SQLite storage: declared DATETIME, values pass through as text unchanged."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "DATETIME"


class UtcDateTime(types.TypeDecorator[datetime]):
    """Aware-UTC timestamp column (see the module docstring)."""

    impl = types.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> types.TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(_SQLiteDateTimeText())
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in MYSQL_DIALECTS:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(types.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        utc = require_aware(value)
        if dialect.name == "sqlite":
            return to_storage_text(utc)
        if dialect.name in MYSQL_DIALECTS:
            return utc.replace(tzinfo=None)  # DATETIME(6) holds UTC wall-clock time
        return utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            return parse_stored_text(value)
        if isinstance(value, datetime):
            if value.tzinfo is None:
                return value.replace(tzinfo=UTC)
            return value.astimezone(UTC)
        raise TypeError(f"unexpected stored timestamp {value!r}")
