"""Argument checks shared by every write: refuse bad input before touching the database."""

from __future__ import annotations

from .models import RunState

# INTEGER columns are 32-bit on PostgreSQL; refuse what one of them cannot hold.
MAX_INTEGER = 2**31 - 1


# Identifiers end up in primary keys and indexes. PostgreSQL refuses a B-tree
# entry over ~2.7 kB, and the widest key (run, node, session) holds three
# identifiers, so each is capped at 512 UTF-8 bytes on every database alike.
MAX_KEY_BYTES = 512


def _checked_str(value: object, name: str, key: bool) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters: {value[:40]!r}")
    if key and len(value) * 4 > MAX_KEY_BYTES and len(value.encode()) > MAX_KEY_BYTES:
        raise ValueError(
            f"{name} is {len(value.encode())} bytes; identifiers are limited to "
            f"{MAX_KEY_BYTES} bytes: {value[:40]!r}..."
        )
    return value


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
