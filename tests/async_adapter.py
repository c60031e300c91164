"""The functional suite on the asyncio facade, with the same test bodies.

``BlockingAsyncProjection`` looks like a ``RunProjection``: each method call
awaits the ``AsyncRunProjection`` coroutine of the same name on an event loop
that runs in a background thread, and ``iter_runs`` pulls its async iterator
one item at a time. Arguments, results and exceptions pass through unchanged,
so a test written against the sync facade checks the async one.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from sqlalchemy.engine import Engine

from relay_flow_projection import AsyncRunProjection

T = TypeVar("T")


class LoopThread:
    """One event loop in a daemon thread, shared by a test session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, awaitable: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(awaitable, self.loop).result()

    def stop(self) -> None:
        # As asyncio.run() ends a loop: the tasks left (the keepers of held
        # connections among them) are cancelled and finish on it first.
        self.call(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _cancel_the_rest() -> None:
    rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


async def _next(iterator: AsyncIterator[T]) -> tuple[bool, T | None]:
    try:
        return True, await anext(iterator)
    except StopAsyncIteration:
        return False, None


class BlockingAsyncProjection:
    """A RunProjection-shaped view of an AsyncRunProjection (see module docstring)."""

    def __init__(self, projection: AsyncRunProjection, loop: LoopThread, engine: Engine) -> None:
        self.async_projection = projection
        self._loop = loop
        # Tests that inspect the database directly use a sync engine on it...
        self.engine = engine
        # ...and tests that listen to execution events listen here.
        self.observed_engine = projection.engine.sync_engine

    def _iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        while True:
            more, item = self._loop.call(_next(iterator))
            if not more:
                return
            yield item  # type: ignore[misc]  # present whenever more is True

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.async_projection, name)
        if name in ("iter_runs", "sweep_retention_batches"):

            def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
                return self._iterate(attribute(*args, **kwargs))

            return iterate
        if inspect.iscoroutinefunction(attribute):
            method: Callable[..., Awaitable[Any]] = attribute

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._loop.call(method(*args, **kwargs))  # type: ignore[arg-type]

            return call
        return attribute

    def close(self) -> None:
        self._loop.call(self.async_projection.close())
