"""How long write transactions held their locks: one measure for the sweep's
benchmark (benchmarks/sweep.py) and its reliability test
(tests/reliability/test_sweep_with_writers.py, which loads this file by path:
it imports nothing of the benchmarks package).

A hold runs from the ``begin`` event (the project's SQLite listener, registered
first, has already taken the write lock with ``BEGIN IMMEDIATE``) -- or, on
psycopg's autocommit writer, from the layer's own ``BEGIN; SET LOCAL ...``
statement -- to the transaction's ``commit`` (or ``rollback``) event, which
comes once ``COMMIT`` has returned: SQLite's write lock and the in-process
writer queue, or a PostgreSQL batch's row locks. Not to the pool's checkin: the
sync facade may keep the connection for its next call (held_connection.py).
Reads (autocommit, ``relay_read_only``) are not counted.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa


class LockHolds:
    """The hold of each write transaction on *engine* (of *thread* only, if given)."""

    def __init__(self, engine: sa.Engine, thread: int | None = None) -> None:
        self.seconds: list[float] = []
        self._thread = thread
        self._began: dict[int, float] = {}
        sa.event.listen(engine, "begin", self._on_begin)
        sa.event.listen(engine, "before_cursor_execute", self._on_statement)
        sa.event.listen(engine, "commit", self._on_end)
        sa.event.listen(engine, "rollback", self._on_end)

    def _watched(self) -> bool:
        return self._thread is None or threading.get_ident() == self._thread

    def _on_begin(self, connection: sa.Connection) -> None:
        options = connection.get_execution_options()
        if not self._watched() or options.get("relay_read_only"):
            return
        if options.get("isolation_level") == "AUTOCOMMIT":
            return  # a read, or psycopg's writer (its BEGIN is a statement: below)
        self._start(connection)

    def _on_statement(self, connection: sa.Connection, *args: object) -> None:
        statement = args[1]
        if self._watched() and str(statement).startswith("BEGIN;"):
            self._start(connection)

    def _start(self, connection: sa.Connection) -> None:
        self._began[id(connection.connection.dbapi_connection)] = time.perf_counter()

    def _on_end(self, connection: sa.Connection) -> None:
        started = self._began.pop(id(connection.connection.dbapi_connection), None)
        if started is not None:
            self.seconds.append(time.perf_counter() - started)
