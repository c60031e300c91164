"""``current`` without SQLAlchemy or Alembic (start-up time).

Importing SQLAlchemy and Alembic costs more than the 0.3 s start-up budget of
``current`` by itself, and for the everyday cases -- a healthy SQLite file, or
a plain PostgreSQL or MySQL/MariaDB URL, whose version table holds one
revision of this release's chain -- neither is needed: the standard library's
sqlite3, psycopg or PyMySQL alone reads the row, and the chain's ids are read from the revision
files' ``revision``/``down_revision`` assignments (with ``ast``: nothing is
executed).

The answer is given only when it is certain; everything else (URLs with
escapes or options SQLAlchemy would render differently, missing or damaged
files, read-only directories, locks, no or several version rows, revisions
this release does not know) returns None and the caller takes the full path
(access.read_revision), which owns those error messages. One error is reported
here: a PostgreSQL or MySQL server that cannot be reached, translated by the package's
one translator (driver_errors.translate_error) under the subject the full path
uses, so that an unreachable server costs one connect timeout, not two.
tests/test_cli_operations.py holds the two paths to the same output.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, unquote

SQLITE_MAGIC = b"SQLite format 3\x00"  # as engine.SQLITE_MAGIC
CONNECT_TIMEOUT = 10  # as engine.DEFAULT_CONNECT_TIMEOUT, in libpq's whole seconds


def sqlite_path(target: str) -> Path | None:
    """The file a plain target names (a path, or ``sqlite:///path`` without options)."""
    if "://" not in target:
        return Path(target) if target else None
    prefix = "sqlite:///"
    if not target.startswith(prefix):
        return None
    database = target[len(prefix) :]
    # Escapes, options and URI file names are left to SQLAlchemy's parser.
    if not database or any(mark in database for mark in "%?#") or database.startswith("file:"):
        return None
    return Path(database)


def chain() -> tuple[frozenset[str], str] | None:
    """(every revision id of the packaged chain, its single head), or None if unsure."""
    from ..revisions import chain as packaged_chain

    return packaged_chain()


def _plainly_healthy(path: Path) -> bool:
    """A regular SQLite file whose header agrees with its size (engine.check_sqlite_file
    judges and words every other case)."""
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return False
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    if page_size < 512 or size % page_size:
        return False
    return Path(f"{path}-wal").exists() or size >= page_count * page_size


def _version_rows(path: Path) -> list[str] | None:
    """The version table's rows, read-only, without waiting for any lock."""
    uri = f"file:{path.resolve()}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=0)
    except sqlite3.Error:
        return None
    try:
        rows = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None  # no version table, locked, damaged: the full path says which
    finally:
        connection.close()
    return [str(row[0]) for row in rows]


# A PostgreSQL URL that SQLAlchemy renders back as it was written (no percent
# escapes but in ``options``, no Unix socket, no query but ``options``), so
# this module can print it as the full path would without SQLAlchemy's parser.
_PLAIN_POSTGRESQL_URL = re.compile(
    r"postgresql(?:\+psycopg)?://"
    r"(?P<user>[A-Za-z0-9_.-]+)(?::(?P<password>[A-Za-z0-9_.~-]+))?@"
    r"(?P<host>[A-Za-z0-9_.-]+)(?::(?P<port>[1-9][0-9]{0,4}))?"
    r"/(?P<dbname>[A-Za-z0-9_.-]+)"
    r"(?:\?options=(?P<options>[A-Za-z0-9_.%-]+))?"
)


def postgresql_connection(target: str) -> tuple[str, dict[str, Any]] | None:
    """(the URL as the full path prints it, psycopg's connect arguments) for a plain
    PostgreSQL URL: the arguments SQLAlchemy's psycopg dialect and
    engine._postgresql_connect_args would pass."""
    plain = _PLAIN_POSTGRESQL_URL.fullmatch(target)
    if plain is None:
        return None
    parts = plain.groupdict()
    if parts["port"] is not None and int(parts["port"]) > 65535:
        return None
    shown = f"postgresql+psycopg://{parts['user']}"
    shown += ":***@" if parts["password"] is not None else "@"
    shown += parts["host"] + (f":{parts['port']}" if parts["port"] else "")
    shown += f"/{parts['dbname']}"
    arguments: dict[str, Any] = {
        name: parts[name] for name in ("user", "password", "host", "port", "dbname") if parts[name]
    }
    if parts["options"] is not None:
        options = unquote(parts["options"])
        if not options.isprintable():
            return None
        shown += f"?options={quote_plus(options)}"
        arguments["options"] = options
    return shown, arguments | {"connect_timeout": CONNECT_TIMEOUT, "prepare_threshold": None}


def _postgresql_revision(target: str) -> tuple[str, list[str]] | None:
    """(the URL as shown, the version table's rows), or None to take the full path."""
    found = postgresql_connection(target)
    if found is None:
        return None
    shown, arguments = found
    try:
        import psycopg
    except ImportError:
        return None  # the full path names the extra to install
    try:
        connection = psycopg.connect(autocommit=True, **arguments)
    except psycopg.OperationalError as exc:
        from ..driver_errors import translate_error

        raise translate_error(exc, f"reading {shown}") from exc
    except psycopg.Error:
        return None
    try:
        rows = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    except psycopg.Error:
        return None  # no version table, no privilege, a dropped connection: the full path says
    finally:
        connection.close()
    return shown, [str(row[0]) for row in rows]


# A MySQL/MariaDB URL of PyMySQL (or none named), rendered back as written but
# for the driver SQLAlchemy's URL adds, with no query at all.
_PLAIN_MYSQL_URL = re.compile(
    r"(?P<backend>mysql|mariadb)(?:\+pymysql)?://"
    r"(?P<user>[A-Za-z0-9_.-]+)(?::(?P<password>[A-Za-z0-9_.~-]+))?@"
    r"(?P<host>[A-Za-z0-9_.-]+)(?::(?P<port>[1-9][0-9]{0,4}))?"
    r"/(?P<database>[A-Za-z0-9_.-]+)"
)


def mysql_connection(target: str) -> tuple[str, dict[str, Any]] | None:
    """(the URL as the full path prints it, PyMySQL's connect arguments) for a plain
    MySQL/MariaDB URL: those SQLAlchemy's dialect and engine._mysql_connect_args pass."""
    plain = _PLAIN_MYSQL_URL.fullmatch(target)
    if plain is None:
        return None
    parts = plain.groupdict()
    port = int(parts["port"] or 3306)
    if port > 65535:
        return None
    shown = f"{parts['backend']}+pymysql://{parts['user']}"
    shown += ":***@" if parts["password"] is not None else "@"
    shown += parts["host"] + (f":{parts['port']}" if parts["port"] else "")
    shown += f"/{parts['database']}"
    arguments = {
        "user": parts["user"],
        "password": parts["password"] or "",
        "host": parts["host"],
        "port": port,
        "database": parts["database"],
        "charset": "utf8mb4",
        "connect_timeout": CONNECT_TIMEOUT,
    }
    return shown, arguments


def _mysql_revision(target: str) -> tuple[str, list[str]] | None:
    """(the URL as shown, the version table's rows), or None to take the full path."""
    found = mysql_connection(target)
    if found is None:
        return None
    shown, arguments = found
    try:
        import pymysql
    except ImportError:
        return None  # the full path names the extra to install
    try:
        connection = pymysql.connect(**arguments)
    except pymysql.err.OperationalError as exc:
        from ..driver_errors import translate_error

        raise translate_error(exc, f"reading {shown}") from exc
    except pymysql.err.MySQLError:
        return None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT version_num FROM alembic_version")
            rows = cursor.fetchall()
    except pymysql.err.MySQLError:
        return None  # no version table, no privilege, a dropped connection: the full path says
    finally:
        connection.close()
    return shown, [str(row[0]) for row in rows]


def _sqlite_revision(target: str) -> tuple[str, list[str]] | None:
    """(the file as shown, the version table's rows), or None to take the full path."""
    path = sqlite_path(target)
    if path is None or not path.is_file() or not os.access(path.parent, os.W_OK):
        return None  # a read-only directory needs the immutable URI (migration_env)
    if not _plainly_healthy(path):
        return None
    rows = _version_rows(path)
    return None if rows is None else (str(path), rows)


def quick_revision(target: str) -> tuple[str, str, str] | None:
    """(database as the operator sees it, its revision, head) when certain, else None."""
    known = chain()
    if known is None:
        return None
    if target.startswith(("postgresql://", "postgresql+psycopg://")):
        found = _postgresql_revision(target)
    elif target.startswith(("mysql://", "mysql+pymysql://", "mariadb://", "mariadb+pymysql://")):
        found = _mysql_revision(target)
    else:
        found = _sqlite_revision(target)
    if found is None:
        return None
    shown, rows = found
    if len(rows) != 1 or rows[0] not in known[0]:
        return None
    return shown, rows[0], known[1]
