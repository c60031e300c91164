"""The one place that knows which database it is talking to.

Everything dialect-specific that statements need goes through here: the
upsert construct (``ON CONFLICT`` or ``ON DUPLICATE KEY UPDATE``), matching a
column against a list of ids, keyset comparisons and index hints, whether
deletes cascade, lock ordering, and how read-only work runs. (Column types differ in
column_types.py; driver errors are recognised in one place,
``driver_errors.translate_error``.) Repository code calls these and stays free of
``if dialect == ...`` branches.

Statement caches are keyed by the *family* name ("sqlite", "postgresql",
"mysql"): MySQL and MariaDB compile alike, whichever name SQLAlchemy gave the
dialect.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Select,
    Table,
    and_,
    any_,
    bindparam,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.types import ARRAY, Text

from .column_types import MYSQL_DIALECTS

SUPPORTED_DIALECTS = ("sqlite", "postgresql", *MYSQL_DIALECTS)


def dialect_name(dialect: Dialect | str) -> str:
    """The supported dialect's family name; statement caches are keyed by it (a str
    keeps no engine alive, a Dialect object would)."""
    name = dialect if isinstance(dialect, str) else dialect.name
    if name not in SUPPORTED_DIALECTS:
        raise NotImplementedError(
            f"relay_flow_projection supports sqlite, postgresql, mysql and mariadb, not {name}"
        )
    return "mysql" if name in MYSQL_DIALECTS else name


UpsertInsert = postgresql.Insert | sqlite.Insert | mysql.Insert


def upsert(
    dialect: Dialect | str,
    table: Table,
    values: Mapping[str, Any],
    *,
    key: Sequence[str],
    overwrite: Sequence[str] = (),
) -> UpsertInsert:
    """``INSERT`` of *values*; when a row with the same *key* exists, the columns
    named in *overwrite* take the new row's values, or (none named) the row
    stays as it is.

    MySQL has no "do nothing": the no-op assignment of a key column stands in
    for it. (``INSERT IGNORE`` would also turn other errors into warnings --
    a child row of a missing run would be dropped silently.)
    """
    family = dialect_name(dialect)
    if family == "mysql":
        statement = mysql.insert(table).values(dict(values))
        if overwrite:
            return statement.on_duplicate_key_update(
                {name: statement.inserted[name] for name in overwrite}
            )
        return statement.on_duplicate_key_update({key[0]: table.c[key[0]]})
    make = postgresql.insert if family == "postgresql" else sqlite.insert
    insert = make(table).values(dict(values))
    columns = [table.c[name] for name in key]
    if overwrite:
        return insert.on_conflict_do_update(
            index_elements=columns, set_={name: insert.excluded[name] for name in overwrite}
        )
    return insert.on_conflict_do_nothing(index_elements=columns)


def matches_any(
    dialect: Dialect | str, column: ColumnElement[str], name: str
) -> ColumnElement[bool]:
    """``column`` equals one of the ids bound under *name* (a list at execution time).

    PostgreSQL binds an array (``= ANY(:ids)``): an expanding ``IN`` with
    thousands of parameters is several times slower there. SQLite binds a
    JSON array that ``json_each`` reads (JSON functions are built in since
    SQLite 3.38): an expanding ``IN`` re-renders, re-prepares and binds
    thousands of parameters per call (retention sweep on SQLite: 12% less
    CPU). MySQL's drivers interpolate parameters on the client and the server
    prepares nothing, so the expanding ``IN`` costs little there, and its
    optimizer turns a literal list into key lookups (``JSON_TABLE`` would be a
    join it cannot).
    """
    family = dialect_name(dialect)
    if family == "postgresql":
        return column == any_(bindparam(name, type_=ARRAY(Text)))
    if family == "mysql":
        return column.in_(bindparam(name, expanding=True))
    listed = func.json_each(bindparam(name, type_=JSON)).table_valued("value")
    return column.in_(select(listed.c.value))


def after_keyset(
    dialect: Dialect | str, columns: Sequence[ColumnElement[Any]], values: Sequence[Any]
) -> ColumnElement[bool]:
    """The rows strictly after *values* in the order of *columns* (keyset paging).

    A row-value comparison where the planner turns it into one index range
    (SQLite, PostgreSQL). MariaDB's range optimizer does not read row
    comparisons (its plan walked the index from its first entry, however deep
    the page); the equivalent nested ``OR`` becomes one range per column
    prefix on the same index.
    """
    if dialect_name(dialect) != "mysql":
        after: ColumnElement[bool] = tuple_(*columns) > tuple_(*values)
        return after
    (first, *rest), (value, *more) = columns, values
    beyond: ColumnElement[bool] = first > value
    if not rest:
        return beyond
    return or_(beyond, and_(first == value, after_keyset(dialect, rest, more)))


def pages_by_index(dialect: Dialect | str, statement: Select[Any], index: str) -> Select[Any]:
    """*statement*, a page in the order of *index*, read along that index.

    MariaDB's optimizer costs a keyset page of a large table (``... > :after
    ORDER BY ... LIMIT 500``) as a range over every row after the cursor and
    chose a full scan and a sort instead -- for every page, so that walking a
    table page by page read it once per page. The index hint keeps it on the
    index the order comes from. The planners of SQLite and PostgreSQL need no
    hint (and take none).
    """
    if dialect_name(dialect) != "mysql":
        return statement
    # "*": the statement is built for the MySQL family only, whichever of its
    # two names the compiling dialect has.
    return statement.with_hint(statement.get_final_froms()[0], f"FORCE INDEX ({index})", "*")


def always_cascades(dialect: Dialect | str) -> bool:
    """True where ``ON DELETE CASCADE`` runs on every connection (PostgreSQL, InnoDB).

    SQLite enforces foreign keys only on connections that turn them on
    (engine.py does; the Go releases and the migrations' table rebuilds do not).
    """
    return dialect_name(dialect) != "sqlite"


def child_insert_locks_parent(dialect: Dialect | str) -> bool:
    """True where inserting a child row share-locks its parent run (InnoDB).

    InnoDB's foreign-key check takes a shared lock on the ``relay_runs`` row,
    which conflicts with the exclusive lock ``update_node`` takes on it first;
    a call that locks a child row before inserting another child (``register_
    node_session``) must then lock the run first, or the two deadlock.
    PostgreSQL's check takes ``KEY SHARE``, which an update of non-key columns
    does not conflict with; SQLite has one write lock.
    """
    return dialect_name(dialect) == "mysql"


def folds_begin(dialect: Dialect) -> bool:
    """True where a write sends ``BEGIN`` and its lock budget as one round trip (psycopg).

    psycopg, sync and asyncio, sends ``BEGIN`` on its own before a transaction's
    first statement, and ``SET LOCAL lock_timeout`` would take one more round
    trip. On an autocommit connection (write_options) the executor sends
    ``BEGIN; SET LOCAL lock_timeout = N`` as one simple query and ``COMMIT``
    itself (execution.run_in_transaction): a write costs its statements plus
    BEGIN and COMMIT. psycopg's ``rollback()``, which SQLAlchemy calls when a
    body fails, acts on the server's transaction status, so it still ends a
    transaction opened this way. asyncpg prepares every statement, and a text of
    two statements cannot be prepared: it keeps the driver's own BEGIN.
    """
    return dialect_name(dialect) == "postgresql" and dialect.driver in {"psycopg", "psycopg_async"}


def keeps_between_calls(dialect: Dialect) -> bool:
    """True where a connection may serve the next call as a call leaves it
    (held_connection.py): SQLite and PostgreSQL.

    There nothing stays open on it: a write ends with its COMMIT, and a read
    runs in autocommit (PostgreSQL's read_options) or without a BEGIN (the
    sqlite3 module sends none: engine.py). On MySQL/MariaDB the driver's
    implicit transaction stays open after a read until the rollback on return
    (its metadata locks would hold a live upgrade's DDL back), and engine.py's
    guard against the server's idle limit counts idleness from the checkin.
    """
    return dialect_name(dialect) != "mysql"


# Why options per connection rather than an engine view
# (``engine.execution_options(isolation_level=...)``): such a view sets the
# isolation level through an ``engine_connect`` listener, and an engine with a
# listener dispatches connection events around every statement -- about 10 us
# a statement on PostgreSQL, measured here. The executor applies these on the
# connection it checks out (``Connection.execution_options``).
AUTOCOMMIT: Mapping[str, Any] = {"isolation_level": "AUTOCOMMIT"}
NO_OPTIONS: Mapping[str, Any] = {}


def write_options(dialect: Dialect) -> Mapping[str, Any]:
    """Connection options for write transactions: autocommit where folds_begin."""
    return AUTOCOMMIT if folds_begin(dialect) else NO_OPTIONS


def read_options(dialect: Dialect) -> Mapping[str, Any]:
    """Connection options for single-statement reads.

    Reads need no transaction around one statement: on PostgreSQL autocommit
    skips the BEGIN/ROLLBACK round trips (2.7x faster reads measured here); on
    SQLite the connection listener skips its ``BEGIN IMMEDIATE`` so readers
    never queue behind writers for the write lock. MySQL drivers send no
    ``BEGIN`` anyway, and switching autocommit would cost a round trip each
    way: reads use the connection as it is (a consistent read, no locks).
    """
    family = dialect_name(dialect)
    if family == "postgresql":
        return AUTOCOMMIT
    if family == "mysql":
        return NO_OPTIONS
    return {"relay_read_only": True}
