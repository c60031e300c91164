"""DDL steps that leave a live table's writers running, frozen as of 0.5.0.

Revisions run while the previous release keeps writing (API.md, *Live
upgrades*). These steps are how a revision changes a table that already
holds rows:

- PostgreSQL: indexes are built ``CONCURRENTLY``, outside the revision's
  transaction (each build commits on its own). A build that was interrupted
  leaves an INVALID index behind; the next upgrade drops it and builds it
  again. Everything else a revision does runs in its transaction under the
  short ``lock_timeout`` the migration environment sets, and is retried
  there (migration_env.run_chain_with_lock_retries).
- MySQL/MariaDB: ``ALGORITHM=INPLACE, LOCK=NONE`` (online DDL), falling back
  to the server's default where it refuses that for a statement. Each step
  is re-runnable: MySQL commits each DDL statement, so a killed revision runs
  again from its first one.
- SQLite: as frozen_v1 (a write locks the whole file anyway).

Like frozen_v1, nothing here may change behaviour once released: a revision
that needs something else gets it from a new module.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from alembic import context, op
from alembic.ddl.base import AddColumn
from sqlalchemy.exc import DBAPIError

from relay_flow_projection.migrations.frozen_v1 import MYSQL, MigrationRefused

log = logging.getLogger("relay_flow_projection.migrations")

# Online DDL clauses: ALTER TABLE's options take commas, CREATE INDEX's do not.
MYSQL_ONLINE_ALTER = ", ALGORITHM=INPLACE, LOCK=NONE"
MYSQL_ONLINE_INDEX = " ALGORITHM=INPLACE LOCK=NONE"
# ER_ALTER_OPERATION_NOT_SUPPORTED(_REASON): the server cannot do this one online.
_MYSQL_NOT_ONLINE = (1845, 1846)


def lint_exemption(rule: str, why: str) -> None:
    """Exempt the next statement of the printed SQL from one migration-linter rule.

    ``.ci/lint_revisions.py`` lints each revision's ``--sql`` output with
    squawk, which honours ``-- squawk-ignore <rule>`` on the line before a
    statement. Say *why* the statement is safe on a live table: the reason is
    printed with it, for the reviewer and the DBA who reads the script.
    """
    if context.is_offline_mode():
        # Straight above the statement: squawk reads the line right before it
        # (Alembic's own static_output would leave a blank line between).
        buffer = op.get_context().impl.output_buffer
        assert buffer is not None  # offline mode always has one
        buffer.write(f"-- squawk-ignore {rule} -- {' '.join(why.split())}\n")


@contextmanager
def index_builds() -> Iterator[None]:
    """Where a revision calls create_index: outside its transaction on PostgreSQL
    (``CONCURRENTLY`` cannot run in one, and each build commits on its own)."""
    if op.get_context().dialect.name == "postgresql":
        with op.get_context().autocommit_block():
            yield
    else:
        yield


def create_index(name: str, table: str, columns: list[str], **kw: Any) -> None:
    """Index *table*, which may hold rows and have writers, without blocking them
    (within ``with index_builds():``)."""
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        _create_index_concurrently(name, table, columns, **kw)
    elif dialect in MYSQL:
        _create_index_online(name, table, columns)
    else:
        op.create_index(name, table, columns, **kw)


def add_column(table: str, column: sa.Column[Any]) -> None:
    """Add a nullable *column* to a live table.

    PostgreSQL adds a nullable column without a default by changing the
    catalog only (a brief ACCESS EXCLUSIVE lock, waited for under the
    environment's lock_timeout); MySQL is asked to do it online.
    """
    if not column.nullable or column.server_default is not None:
        raise MigrationRefused(
            f"{table}.{column.name}: add a nullable column without a default, "
            "then backfill it in batches (README, Writing a revision)"
        )
    if op.get_context().dialect.name not in MYSQL:
        op.add_column(table, column)
        return
    catalog = _mysql_catalog()
    if catalog is not None and column.name in {c["name"] for c in catalog.get_columns(table)}:
        return
    # Alembic's own ADD COLUMN construct, rendered by the dialect; only the
    # online clause (a constant) is appended.
    ddl = AddColumn(table, column).compile(dialect=op.get_context().dialect)
    _mysql_online(str(ddl), MYSQL_ONLINE_ALTER)


# ------------------------------------------------------------- PostgreSQL ---

# The index of that name in the current schema: valid?, its table, its columns.
_POSTGRES_INDEX = sa.text(
    """SELECT i.indisvalid, t.relname,
           array(SELECT a.attname::text
                 FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, position)
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                 ORDER BY k.position)
       FROM pg_index i
       JOIN pg_class c ON c.oid = i.indexrelid
       JOIN pg_class t ON t.oid = i.indrelid
       JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE c.relname = :name AND n.nspname = current_schema()"""
)


def _create_index_concurrently(name: str, table: str, columns: list[str], **kw: Any) -> None:
    if not context.is_offline_mode():
        found = op.get_bind().execute(_POSTGRES_INDEX, {"name": name}).first()
        if found is not None:
            valid, on_table, on_columns = found
            _refuse_other_index(name, table, columns, on_table, list(on_columns))
            if valid:
                return
            log.warning("%s: an interrupted build left this index invalid; building it again", name)
            op.drop_index(name, table_name=table, postgresql_concurrently=True)
    op.create_index(name, table, columns, postgresql_concurrently=True, **kw)


# ---------------------------------------------------------- MySQL/MariaDB ---


def _mysql_catalog() -> sa.Inspector | None:
    return None if context.is_offline_mode() else sa.inspect(op.get_bind())


def _create_index_online(name: str, table: str, columns: list[str]) -> None:
    catalog = _mysql_catalog()
    if catalog is not None:
        for found in catalog.get_indexes(table):
            if found["name"] == name:
                on_columns = [str(column) for column in found["column_names"]]
                _refuse_other_index(name, table, columns, table, on_columns)
                return
    columns_of = sa.Table(table, sa.MetaData(), *(sa.Column(c) for c in columns)).c
    index = sa.Index(name, *(columns_of[c] for c in columns))
    ddl = sa.schema.CreateIndex(index).compile(dialect=op.get_context().dialect)
    _mysql_online(str(ddl), MYSQL_ONLINE_INDEX)


def _mysql_online(statement: str, online: str) -> None:
    """*statement* with *online* appended; without it where the server refuses that."""
    if context.is_offline_mode():
        op.execute(statement + online)
        return
    try:
        op.execute(statement + online)
    except DBAPIError as exc:
        code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
        if code not in _MYSQL_NOT_ONLINE:
            raise
        log.warning("the server cannot run this online (%s); running it as is: %s", code, statement)
        op.execute(statement)


def _refuse_other_index(
    name: str, table: str, columns: list[str], on_table: str, on_columns: list[str]
) -> None:
    if (on_table, on_columns) != (table, columns):
        # Not one a revision left behind: an index of our name on something else.
        raise MigrationRefused(
            f"{on_table} already has an index {name} on ({', '.join(on_columns)}), not "
            f"{table} ({', '.join(columns)}): drop it, then upgrade again"
        )
