"""Durations on the command line: ``4w``, ``30d``, ``12h``, ``90m``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import click

_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes"}
_PATTERN = re.compile(r"(\d+)([wdhm])")


@dataclass(frozen=True, slots=True)
class Duration:
    text: str
    delta: timedelta

    def before(self, now: datetime) -> datetime:
        """The instant this long before *now*."""
        try:
            return now - self.delta
        except OverflowError:
            raise click.BadParameter(f"{self.text} reaches back before the year 1") from None


def parse_duration(text: str) -> Duration:
    """``<positive integer><w|d|h|m>``; ValueError for anything else."""
    match = _PATTERN.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration: use a number and w, d, h or m (4w, 30d, 12h, 90m)"
        )
    amount = int(match.group(1))
    if amount == 0:
        raise ValueError(f"{text!r} is not a positive duration")
    try:
        delta = timedelta(**{_UNITS[match.group(2)]: amount})
    except OverflowError:
        raise ValueError(f"{text!r} is too long a duration") from None
    return Duration(f"{amount}{match.group(2)}", delta)


def duration_option(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> Duration | None:
    """An option callback: ``--older-than 30d`` becomes a :class:`Duration`."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
