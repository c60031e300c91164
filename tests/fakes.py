"""Test doubles shared by the suites (a module name unique across tests/ and its subfolders)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class FakeClock:
    """A controllable clock for RunProjection(clock=...): starts at a fixed instant."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now
