"""Test doubles shared by the suites (a module name unique across tests/ and its subfolders)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone


class FakeClock:
    """A controllable clock for RunProjection(clock=...): starts at a fixed instant."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


IST = timezone(timedelta(hours=5, minutes=30))


class OwnText(datetime):
    """A datetime subclass with its own text (as pendulum/arrow-like types have).

    SQLite stores ``isoformat()`` text, so this text, if it reached the
    database, would break ordering and every later read of the row.
    """

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return "around " + datetime.isoformat(self, sep, timespec)


def as_subclass(kind: type[datetime], value: datetime) -> datetime:
    """*value* as an instance of the datetime subclass *kind*."""
    return kind(
        value.year, value.month, value.day, value.hour, value.minute, value.second,
        value.microsecond, tzinfo=value.tzinfo,
    )  # fmt: skip
