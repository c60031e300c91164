"""What a pool saw, counted with its own events (test_held_connection.py and
test_async_held_connection.py): checkouts, new DBAPI connections, closed ones."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine


class PoolCounts:
    """Checkouts, new DBAPI connections and closed ones of one engine's pool (for an
    AsyncEngine: of its ``sync_engine``)."""

    def __init__(self, engine: Engine) -> None:
        self.checkouts = self.connects = self.closes = 0
        sa.event.listen(engine, "checkout", self._on_checkout)
        sa.event.listen(engine, "connect", self._on_connect)
        sa.event.listen(engine, "close", self._on_close)

    def _on_checkout(self, *_args: Any) -> None:
        self.checkouts += 1

    def _on_connect(self, *_args: Any) -> None:
        self.connects += 1

    def _on_close(self, *_args: Any) -> None:
        self.closes += 1
