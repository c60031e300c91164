"""How the migration chain shares live tables with their writers (API.md, *Live upgrades*).

A revision statement that needs a table lock (``ALTER TABLE``, a foreign key
to ``relay_runs``) queues every writer of that table behind itself for as
long as it waits for the lock: one long reader ahead of it would stall every
service. So such a statement waits at most DDL_LOCK_TIMEOUT. When that runs
out, its revision is rolled back (MySQL: its steps are re-runnable), the
writers go on, and the chain runs again after a pause that grows -- until
RELAY_FLOW_MIGRATION_LOCK_TIMEOUT, when the upgrade gives up naming who held
the lock. Each retry is logged with the statement and the lock's holders.

What does not need a table lock runs without this limit: concurrent index
builds (which wait for old transactions without blocking anyone) and the
backfills' short batches (frozen_v2, 0004).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from .dialect import dialect_name
from .driver_errors import is_lock_wait
from .errors import DatabaseBusy

log = logging.getLogger("relay_flow_projection.migrations")

# Seconds one statement of a revision waits for a lock: writers queued behind
# it wait as long, so it is short. MySQL takes whole seconds (engine.py).
DDL_LOCK_TIMEOUT = 1.0
# The pauses between attempts double from the first to the longest.
FIRST_PAUSE = 0.25
LONGEST_PAUSE = 5.0

_MILLISECONDS = int(DDL_LOCK_TIMEOUT * 1000)
_SECONDS = int(DDL_LOCK_TIMEOUT)


def printed_lock_timeouts(family: str) -> tuple[str, ...]:
    """What a printed (``--sql``) script sets first, for the session that runs it."""
    if family == "postgresql":
        return (f"SET lock_timeout = {_MILLISECONDS}",)
    if family == "mysql":
        return (
            f"SET SESSION lock_wait_timeout = {_SECONDS}",
            f"SET SESSION innodb_lock_wait_timeout = {_SECONDS}",
        )
    return ()


@contextmanager
def short_lock_waits(connection: Connection) -> Iterator[None]:
    """Every transaction the chain opens on *connection* waits DDL_LOCK_TIMEOUT for a lock.

    PostgreSQL: ``SET LOCAL`` as each transaction begins (transaction-scoped,
    so nothing stays behind on a pooler's server connection); not in Alembic's
    autocommit blocks, where concurrent index builds wait for old transactions
    as long as they must -- blocking no writer meanwhile. MySQL/MariaDB: the
    migration engine's sessions are set up so (migration_env builds it with
    this lock_timeout). SQLite: its busy timeout, as always.
    """
    if dialect_name(connection.dialect) != "postgresql":
        yield
        return

    def limit_lock_waits(conn: Connection) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {_MILLISECONDS}")

    event.listen(connection, "begin", limit_lock_waits)
    try:
        yield
    finally:
        event.remove(connection, "begin", limit_lock_waits)


def run_with_lock_retries(
    run: Callable[[], None], connection: Connection, patience: float, subject: str
) -> None:
    """Run the chain (*run*); while a statement of it times out waiting for a lock,
    roll back, pause and run it again, for *patience* seconds in all."""
    deadline = time.monotonic() + patience
    for attempt in itertools.count(1):
        try:
            run()
            return
        except DBAPIError as exc:
            if exc.connection_invalidated or not is_lock_wait(exc.orig):
                raise
            connection.rollback()
            waited = f"{_first_line(exc.statement)} waited for a lock {_held_by(connection)}"
            pause = min(LONGEST_PAUSE, FIRST_PAUSE * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
            if time.monotonic() + pause > deadline:
                raise DatabaseBusy(
                    f"{subject}: {waited}; gave up after {attempt} attempts in {patience:g} s "
                    "(set RELAY_FLOW_MIGRATION_LOCK_TIMEOUT to wait longer)"
                ) from exc
            log.warning("%s; the revision was rolled back, retrying in %.1f s", waited, pause)
            time.sleep(pause)


def _first_line(statement: str | None) -> str:
    line = " ".join((statement or "a statement").split())
    return line if len(line) <= 100 else line[:97] + "..."


def _held_by(connection: Connection) -> str:
    """Who holds locks on the relay tables now (the longest-running first)."""
    family = dialect_name(connection.dialect)
    query = _POSTGRES_HOLDERS if family == "postgresql" else _MYSQL_HOLDERS
    try:
        holders = connection.execute(query).all()
        connection.rollback()
    except DBAPIError:
        connection.rollback()
        return "(its holders could not be read)"
    if not holders:
        return "(its holder has finished since)"
    described = [
        f"{kind} {session} ({state or 'unknown state'}, in a transaction since "
        f"{utc_text(since)}: {_first_line(query_text) if query_text else 'no statement'})"
        for kind, session, state, since, query_text in holders
    ]
    return "held by " + "; ".join(described)


def utc_text(value: datetime | None) -> str:
    """A server's timestamp for a message (naive ones are MySQL's: UTC, engine.py)."""
    if value is None:
        return "an unknown time"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_POSTGRES_HOLDERS = text(
    """SELECT DISTINCT 'PostgreSQL backend', a.pid, a.state, a.xact_start, a.query
       FROM pg_locks l
       JOIN pg_class c ON c.oid = l.relation
       JOIN pg_stat_activity a ON a.pid = l.pid
       WHERE l.granted AND l.pid <> pg_backend_pid() AND c.relname LIKE 'relay\\_%'
         AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
       ORDER BY a.xact_start LIMIT 3"""
)
# Open InnoDB transactions of other sessions on this database: what holds the
# metadata and row locks a revision waits for (metadata_lock_info, which would
# say exactly, is a plugin rarely loaded).
_MYSQL_HOLDERS = text(
    """SELECT 'MySQL connection', t.trx_mysql_thread_id, p.command, t.trx_started,
              COALESCE(t.trx_query, p.info)
       FROM information_schema.innodb_trx t
       LEFT JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id
       WHERE t.trx_mysql_thread_id <> CONNECTION_ID() AND p.db = DATABASE()
       ORDER BY t.trx_started LIMIT 3"""
)
