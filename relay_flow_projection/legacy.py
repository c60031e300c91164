"""Recognising databases that relay-flow's Go releases left without a version marker.

Those releases ran ``CREATE TABLE IF NOT EXISTS`` and an "add the column if
missing" loop at every start, so their databases carry no Alembic version.
Three shapes exist (LEGACY.md); each matches one early revision of our chain,
which is stamped so that ``upgrade`` then runs only what that shape still
needs. Stamping head over such a database would skip those revisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from .errors import NotAProjectionDatabase

GENERATION_1 = "0001_generation_1"
GENERATION_2 = "0002_generation_2"
GENERATION_3 = "0003_generation_3"

_RUN_COLUMNS_1 = frozenset(
    {
        "id",
        "repo",
        "workflow",
        "ticket_id",
        "ticket_key",
        "state",
        "current_node",
        "current_node_visit_id",
        "last_error",
        "started_at",
        "updated_at",
        "finished_at",
    }
)
_RUN_COLUMNS_2 = _RUN_COLUMNS_1 | {"retry_error", "retry_attempt", "next_retry_at"}
_RUN_COLUMNS_3 = _RUN_COLUMNS_2 | {"logical_run_id", "attempt_id"}
_CHILD_TABLES = frozenset({"relay_node_runtime", "relay_processed_reports", "relay_node_sessions"})
_IDENTITY_TABLE = "relay_executor_identity"


@dataclass(frozen=True, slots=True)
class Generation:
    revision: str
    tables: frozenset[str]
    run_columns: frozenset[str]


GENERATIONS = (
    Generation(GENERATION_1, frozenset({"relay_runs"}), _RUN_COLUMNS_1),
    Generation(GENERATION_2, frozenset({"relay_runs"}) | _CHILD_TABLES, _RUN_COLUMNS_2),
    Generation(
        GENERATION_3,
        frozenset({"relay_runs", _IDENTITY_TABLE}) | _CHILD_TABLES,
        _RUN_COLUMNS_3,
    ),
)


def detect_legacy_generation(connection: Connection) -> str | None:
    """The revision matching an unversioned relay database, or None when it has no relay tables.

    Only the three known shapes are accepted: anything else (a half-created
    schema, a foreign table named relay_runs) is refused rather than guessed at.
    """
    inspector = inspect(connection)
    relay_tables = frozenset(
        name for name in inspector.get_table_names() if name.startswith("relay_")
    )
    if not relay_tables:
        return None
    run_columns: frozenset[str] = frozenset()
    if "relay_runs" in relay_tables:
        run_columns = frozenset(column["name"] for column in inspector.get_columns("relay_runs"))
    for generation in GENERATIONS:
        if relay_tables == generation.tables and run_columns == generation.run_columns:
            return generation.revision
    raise NotAProjectionDatabase(
        "the database has relay tables but no version marker, and they match no known "
        f"relay-flow release: tables {sorted(relay_tables)}, "
        f"relay_runs columns {sorted(run_columns)}"
    )
