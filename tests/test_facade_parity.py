"""RunProjection and AsyncRunProjection offer the same API (issue 21).

Both facades hand the same operations (operations.py) to their executor, so a
method added, renamed or given another argument on one side only is drift a
caller would find in production. Held here: the same public names, and for
each the same parameters (names, kinds, defaults, annotations) and the same
return type, where the asyncio side returns it from a coroutine, an
AsyncIterator in place of an Iterator, and an AsyncEngine in place of an Engine.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from relay_flow_projection import AsyncRunProjection, RunProjection

pytestmark = pytest.mark.sqlite_only

# The sync side's return annotation spelled the asyncio way.
ASYNC_SPELLING = (
    (r"\bIterator\[", "AsyncIterator["),
    (r"\bEngine\b", "AsyncEngine"),
    (r"\bRunProjection\b", "AsyncRunProjection"),
)
# Context-manager protocol: the same role under the asyncio names.
PROTOCOL = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _public(cls: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(cls).items()
        if not name.startswith("_") or name in PROTOCOL or name in PROTOCOL.values()
    }


def _function(member: Any) -> Callable[..., Any]:
    function = member.fget if isinstance(member, property) else member
    assert callable(function), member
    return function


def _asyncio_spelling(annotation: str) -> str:
    for pattern, replacement in ASYNC_SPELLING:
        annotation = re.sub(pattern, replacement, annotation)
    return annotation


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any, Any]]:
    return [
        (parameter.name, parameter.kind, parameter.default, parameter.annotation)
        for parameter in inspect.signature(function).parameters.values()
    ]


SYNC = _public(RunProjection)
ASYNC = _public(AsyncRunProjection)


def test_both_facades_have_the_same_public_names() -> None:
    expected = {PROTOCOL.get(name, name) for name in SYNC}
    assert set(ASYNC) == expected


@pytest.mark.parametrize("name", sorted(SYNC))
def test_each_method_has_the_same_signature(name: str) -> None:
    sync_member = SYNC[name]
    async_member = ASYNC[PROTOCOL.get(name, name)]
    assert isinstance(sync_member, property) == isinstance(async_member, property), name
    sync_function, async_function = _function(sync_member), _function(async_member)
    assert _parameters(async_function) == _parameters(sync_function), name

    sync_returns = inspect.signature(sync_function).return_annotation
    async_returns = inspect.signature(async_function).return_annotation
    assert async_returns == _asyncio_spelling(sync_returns), name


@pytest.mark.parametrize("name", sorted(SYNC))
def test_each_call_that_talks_to_the_database_is_awaitable(name: str) -> None:
    """Every asyncio method is a coroutine function, except the property and the two
    iterators, which return an AsyncIterator at once (their arguments checked then)."""
    async_function = _function(ASYNC[PROTOCOL.get(name, name)])
    returns = inspect.signature(async_function).return_annotation
    immediate = isinstance(ASYNC[PROTOCOL.get(name, name)], property) or returns.startswith(
        "AsyncIterator["
    )
    assert inspect.iscoroutinefunction(async_function) is not immediate, name
