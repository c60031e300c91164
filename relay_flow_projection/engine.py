"""Targets and engines: what a path or URL means, and how SQLite connections are set up."""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url

from .errors import NotAProjectionDatabase, ProjectionError

Target = str | os.PathLike[str]

DEFAULT_URL = "sqlite:///relay-flow.db"
BUSY_TIMEOUT_MS = 30_000
# Keep the -wal file from staying at the size of the largest transaction ever run.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
SQLITE_MAGIC = b"SQLite format 3\x00"
FILE_MODE = 0o600


@dataclass(frozen=True, slots=True)
class ResolvedTarget:
    """A target as a SQLAlchemy URL, plus the database file when it is a SQLite file."""

    url: URL
    path: Path | None

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    def describe(self) -> str:
        return str(self.path) if self.path is not None else self.url.render_as_string()


def resolve_target(target: Target) -> ResolvedTarget:
    """A path (str or PathLike) means a SQLite file; a string containing ``://`` is a URL."""
    if isinstance(target, str) and "://" in target:
        url = make_url(target)
        path = None
        if url.get_backend_name() == "sqlite":
            database = url.database or ""
            if database and database != ":memory:" and not database.startswith("file:"):
                path = Path(database)
        return ResolvedTarget(url, path)
    if not isinstance(target, str | os.PathLike):
        raise TypeError(f"target must be a path or URL string, not {type(target).__name__}")
    if not os.fspath(target):
        raise ValueError("target must not be empty")
    path = Path(os.fspath(target))
    return ResolvedTarget(URL.create("sqlite", database=str(path)), path)


def check_sqlite_file(path: Path) -> None:
    """Refuse, without opening it, a file SQLite would reject or corrupt.

    Runs before SQLite sees the file so that a file that is not a database is
    left byte-for-byte untouched (no ``-wal``/``-shm`` appears beside it).
    """
    if path.is_dir():
        raise NotAProjectionDatabase(f"{path} is a directory, not a SQLite database")
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ProjectionError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if size == 0:
        return  # SQLite treats an empty file as an empty database
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise NotAProjectionDatabase(f"{path} is not a SQLite database")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    if page_size < 512:
        raise NotAProjectionDatabase(f"{path} is not a SQLite database (page size {page_size})")
    # While a -wal file exists the main file is not the whole database: another
    # process's checkpoint writes page 1 (the new page count) before the pages
    # that extend the file, so the sizes below disagree for a moment on a
    # healthy database. Only a database without a WAL can be judged by its size.
    if Path(f"{path}-wal").exists():
        return
    if size % page_size or size < page_count * page_size:
        raise NotAProjectionDatabase(
            f"{path} is a truncated or damaged SQLite database "
            f"({size} bytes, header says {page_count} pages of {page_size})"
        )


def create_private_file(path: Path) -> None:
    """Create *path* with mode 0600 before SQLite opens it; tighten an existing file.

    SQLite gives the ``-wal`` and ``-shm`` files the mode of the database file,
    so they are private from their first byte too.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    except IsADirectoryError as exc:
        raise NotAProjectionDatabase(f"{path} is a directory, not a SQLite database") from exc
    except OSError as exc:
        raise ProjectionError(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def _enter_wal_mode(cursor: sqlite3.Cursor) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds a lock.

    Switching a new database into WAL mode needs an exclusive lock, and SQLite
    answers "database is locked" at once, without the busy handler: processes
    initializing one new file together failed here. Once in WAL mode (it
    persists in the file) the pragma takes no lock and succeeds first time.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _install_sqlite_listeners(engine: Engine, *, foreign_keys: bool, read_only: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module: it would
        # otherwise begin DEFERRED transactions lazily before the first write,
        # so a read-then-write could not be atomic. `_on_begin` emits BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cursor.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
            if not read_only:
                _enter_wal_mode(cursor)
                cursor.execute("PRAGMA synchronous = NORMAL")
                cursor.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        options = connection.get_execution_options()
        # AUTOCOMMIT connections (Alembic's autocommit_block) must get no BEGIN:
        # one would never be committed and their writes would be lost.
        if options.get("isolation_level") == "AUTOCOMMIT":
            return
        if options.get("relay_read_only") or read_only:
            return  # single-statement reads run in SQLite's own autocommit
        # Take the write lock now: a deferred transaction that reads and then
        # writes fails at once with SQLITE_BUSY when it loses the race, and
        # busy_timeout cannot help it.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _utc_session(dbapi_connection: Any, _record: Any) -> None:
    """PostgreSQL sessions in UTC: a session zone far from UTC cannot even read
    back the extreme timestamps it accepted (year 1 under America/New_York)."""
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.execute("SET TIME ZONE 'UTC'")
    finally:
        dbapi_connection.autocommit = autocommit


def build_engine(
    resolved: ResolvedTarget,
    *,
    foreign_keys: bool = True,
    read_only: bool = False,
    **engine_kwargs: Any,
) -> Engine:
    """An engine for *resolved*; the SQLite file is checked (and created 0600) first."""
    if not resolved.is_sqlite:
        engine = sqlalchemy.create_engine(resolved.url, **engine_kwargs)
        if engine.dialect.name == "postgresql":
            event.listen(engine, "connect", _utc_session)
        return engine
    url = resolved.url
    if resolved.path is not None:
        check_sqlite_file(resolved.path)
        if read_only:
            if not resolved.path.exists():
                raise ProjectionError(f"{resolved.path} does not exist")
            url = URL.create(
                "sqlite",
                database=f"file:{resolved.path.resolve()}",
                query={"mode": "ro", "uri": "true"},
            )
        else:
            create_private_file(resolved.path)
    engine = sqlalchemy.create_engine(url, **engine_kwargs)
    _install_sqlite_listeners(engine, foreign_keys=foreign_keys, read_only=read_only)
    return engine


def create_engine(target: Target, **engine_kwargs: Any) -> Engine:
    """Public entry point (API.md): an engine with the project's connection settings."""
    return build_engine(resolve_target(target), **engine_kwargs)
