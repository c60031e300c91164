"""Argument checks shared by every write: refuse bad input before touching the database."""

from __future__ import annotations

from dataclasses import replace

from .column_types import IDENTIFIER_BYTES
from .models import Run, RunFilter, RunState
from .timestamps import require_aware

# INTEGER columns are 32-bit on PostgreSQL; refuse what one of them cannot hold.
MAX_INTEGER = 2**31 - 1


# Identifiers (run, node, visit, session, report, ticket ids and keys, repo,
# workflow) end up in primary keys, indexes and compared columns. PostgreSQL
# refuses a B-tree entry over ~2.7 kB, MySQL/MariaDB store them as
# VARBINARY(512) (column_types.py; InnoDB keys end at 3,072 bytes), and the
# widest key (run, node, session) holds three: each is capped at 512 UTF-8
# bytes on every database alike, so a value one accepts the others accept.
MAX_KEY_BYTES = IDENTIFIER_BYTES


def _checked_str(value: object, name: str, key: bool) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters: {value[:40]!r}")
    # ASCII (nearly every identifier) is one byte per character and cannot
    # hold a surrogate: only other text pays for the encoding.
    size = len(value) if value.isascii() else _utf8_size(value, name)
    if key and size > MAX_KEY_BYTES:
        raise ValueError(
            f"{name} is {size} bytes; identifiers are limited to "
            f"{MAX_KEY_BYTES} bytes: {value[:40]!r}..."
        )
    return value


def _utf8_size(value: str, name: str) -> int:
    """The UTF-8 length of *value*; a lone surrogate is refused here.

    Both drivers encode text as UTF-8, and a lone surrogate (``"\\ud800"``,
    e.g. from a badly decoded file name) has no UTF-8 form: without this check
    it surfaces as a raw UnicodeEncodeError from inside the driver.
    """
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} is not valid Unicode text (lone surrogate at index {exc.start}): "
            f"{value[:40]!r}"
        ) from None


def required_text(value: object, name: str, *, key: bool = True) -> str:
    """A non-empty identifier; NUL is refused on every database (PostgreSQL cannot store it)."""
    text = _checked_str(value, name, key)
    if not text:
        raise ValueError(f"{name} must not be empty")
    return text


def optional_text(value: object, name: str, *, key: bool = True) -> str | None:
    """Optional text: None and '' both mean "absent" and are stored as NULL."""
    if value is None or value == "":
        return None
    return required_text(value, name, key=key)


def plain_text(value: object, name: str, *, key: bool = True) -> str:
    """Text that may be empty (ticket fields, for instance) but is never NULL.

    *key* (the default) applies the identifier size limit; free text such as
    error messages passes ``key=False`` and may be as long as the caller likes.
    """
    return _checked_str(value, name, key)


def run_state(value: object) -> RunState:
    if isinstance(value, RunState):
        return value
    try:
        return RunState(value)  # type: ignore[arg-type]  # anything else is refused below
    except ValueError:
        allowed = ", ".join(s.value for s in RunState)
        raise ValueError(f"unknown run state {value!r} (expected one of: {allowed})") from None


def non_negative(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    if value > MAX_INTEGER:
        raise ValueError(f"{name} must be at most {MAX_INTEGER}, got {value}")
    return value


def positive(value: object, name: str) -> int:
    number = non_negative(value, name)
    if number == 0:
        raise ValueError(f"{name} must be positive, got 0")
    return number


def run_filter(filter: object) -> RunFilter:
    """The filter of list_runs / iter_runs / count_runs, or "any" for None.

    ``active`` must be a real bool: ``RunFilter(active="false")`` is truthy and
    would silently list the active runs.
    """
    if filter is None:
        return RunFilter()
    if not isinstance(filter, RunFilter):
        raise TypeError(f"filter must be a RunFilter or None, not {type(filter).__name__}")
    for name in ("repo", "workflow", "ticket"):
        value = getattr(filter, name)
        if value is not None:
            plain_text(value, name)
    if filter.active is not None and not isinstance(filter.active, bool):
        raise TypeError(
            f"active must be a bool or None, not {type(filter.active).__name__} "
            f"({str(filter.active)[:40]!r})"
        )
    return filter


def keyset_after(after: object) -> Run | None:
    """The keyset cursor of list_runs: a Run (as list_runs returned it) or None.

    Only its ``started_at`` and ``id`` are used; both are checked here so that a
    wrong cursor is refused as bad input, not met as a driver error mid-query.
    """
    if after is None:
        return None
    if not isinstance(after, Run):
        raise TypeError(f"after must be a Run or None, not {type(after).__name__}")
    plain_text(after.id, "after.id")
    started_at = require_aware(after.started_at, "after.started_at")
    return after if started_at is after.started_at else replace(after, started_at=started_at)
