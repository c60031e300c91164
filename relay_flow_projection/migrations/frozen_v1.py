"""What revisions 0001-0005 need from outside Alembic, frozen as of 0.4.0.

A revision must do tomorrow exactly what it did the day it shipped, so the
revisions never import live package code (the timestamp column type, the
timestamp parser, the error classes): a change there would silently change
what an old revision does to a database that has not run it yet. Nothing in
this module may change behaviour, ever. A revision that needs something
different gets it from a new ``frozen_v2`` module, leaving this one as it is.

Deliberately a copy, not an import, of ``relay_flow_projection.timestamps``
as it stood when 0004 was written.

0.4.0 added MySQL/MariaDB (the types' ``with_variant``, the table options and
the re-runnable DDL below) before any MySQL database existed: the DDL these
revisions print for SQLite and PostgreSQL is byte for byte that of 0.3.0
(tests/test_migrations.py holds it).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import context, op
from alembic.util import CommandError
from sqlalchemy.dialects import mysql

MYSQL = ("mysql", "mariadb")


class MigrationRefused(CommandError):
    """A revision refuses to run as called (Alembic's own error: one line on its CLI)."""


def utc_timestamp() -> sa.types.TypeEngine[datetime]:
    """The DDL of the package's timestamp columns: ``DATETIME`` on SQLite,
    ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL, ``DATETIME(6)`` on MySQL
    (what ``UtcDateTime`` renders)."""
    return sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), *MYSQL)


def identifier() -> sa.types.TypeEngine[str]:
    """An identifier column: ``TEXT``, ``VARBINARY(512)`` on MySQL (column_types.py)."""
    return sa.Text().with_variant(mysql.VARBINARY(512), *MYSQL)


def free_text() -> sa.types.TypeEngine[str]:
    """A free-text column: ``TEXT``, ``LONGTEXT`` on MySQL (column_types.py)."""
    return sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL)


# InnoDB and utf8mb4 whatever the server's defaults (schema.MYSQL_TABLE_OPTIONS).
MYSQL_TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
}


# ----------------------------------------------------- re-runnable DDL ---
# MySQL commits every DDL statement on its own: a revision killed half-way
# leaves what it had done, with alembic_version unchanged, and runs again from
# its first statement on the next upgrade. There each step below first asks
# the catalog whether it is done. SQLite and PostgreSQL roll an interrupted
# revision back whole, so their steps run unconditionally, as they always
# did (and a printed --sql script asks no catalog).


def _catalog() -> sa.Inspector | None:
    """A fresh inspector where steps must be re-runnable (online MySQL), else None."""
    if context.is_offline_mode():
        return None
    bind = op.get_bind()
    return sa.inspect(bind) if bind.dialect.name in MYSQL else None


def create_table(name: str, *items: Any) -> None:
    catalog = _catalog()
    if catalog is None or not catalog.has_table(name):
        op.create_table(name, *items, **MYSQL_TABLE_OPTIONS)


def add_column(table: str, column: sa.Column[Any]) -> None:
    catalog = _catalog()
    if catalog is None or column.name not in {c["name"] for c in catalog.get_columns(table)}:
        op.add_column(table, column)


def create_index(name: str, table: str, columns: list[str], **kw: Any) -> None:
    catalog = _catalog()
    found = {} if catalog is None else {i["name"]: i for i in catalog.get_indexes(table)}
    if name not in found:
        op.create_index(name, table, columns, **kw)
    elif found[name]["column_names"] != columns:
        # Not one this revision left behind: an index of our name on other columns.
        others = ", ".join(map(str, found[name]["column_names"]))
        raise MigrationRefused(
            f"{table} already has an index {name} on ({others}), not on "
            f"({', '.join(columns)}): drop it, then upgrade again"
        )


def normalize_stored_text(text: str | None) -> str | None:
    """A stored SQLite timestamp, any form relay-flow ever wrote, in the canonical
    fixed-width layout ``YYYY-MM-DD HH:MM:SS.ffffff+00:00`` (text order = time order)."""
    if text is None:
        return None
    return _normalize_utc_text(text) or _to_storage_text(_parse_stored_text(text))


def _to_storage_text(value: datetime) -> str:
    return value.isoformat(sep=" ", timespec="microseconds")


def _parse_stored_text(text: str) -> datetime:
    # Python 3.11's fromisoformat reads Go's layout (nine-digit fractions are
    # truncated, any offset); a value without an offset was written as UTC.
    parsed = datetime.fromisoformat(text.strip())
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _normalize_utc_text(text: str) -> str | None:
    """Go's UTC layout made canonical by padding or truncating the fraction, at a
    third of the general path's cost; None for every other form."""
    length = len(text)
    if not (length == 25 or 27 <= length <= 34) or not text.endswith("+00:00"):
        return None
    head = text[:19]
    if not (
        head.isascii()
        and head[4] == head[7] == "-"
        and head[10] == " "
        and head[13] == head[16] == ":"
    ):
        return None
    if length == 25:
        fraction = "000000"
    else:
        digits = text[20:-6]
        if text[19] != "." or not (digits.isascii() and digits.isdigit()):
            return None
        fraction = digits[:6].ljust(6, "0")
    try:
        if datetime.fromisoformat(head).tzinfo is not None:  # validates every field
            return None
    except ValueError:
        return None
    return f"{head}.{fraction}+00:00"
