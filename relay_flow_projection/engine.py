"""Targets and engines: what a path or URL means, and how SQLite connections are set up."""

from __future__ import annotations

import errno
import importlib
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError
from sqlalchemy.pool import AsyncAdaptedQueuePool

from .column_types import MYSQL_DIALECTS
from .errors import ExtraNotInstalled, NotAProjectionDatabase, ProjectionError
from .url_secrets import remember_secrets, shown_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

from .execution import (
    DEFAULT_LOCK_TIMEOUT,
    LOCK_TIMEOUT_OPTION,
    busy_timeout_pragma,
    track_for_fork,
)

Target = str | os.PathLike[str]

DEFAULT_URL = "sqlite:///relay-flow.db"
DEFAULT_CONNECT_TIMEOUT = 10.0
# SQLite's busy timeout under the default lock_timeout (the benchmarks' raw baselines use it).
BUSY_TIMEOUT_MS = round(DEFAULT_LOCK_TIMEOUT * 1000)
# Keep the -wal file from staying at the size of the largest transaction ever run.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
SQLITE_MAGIC = b"SQLite format 3\x00"
FILE_MODE = 0o600
# MySQL/MariaDB: how much longer than lock_timeout a reply may take before the
# server counts as gone (PyMySQL's read_timeout), and the part of the server's
# wait_timeout after which an idle pooled connection is replaced.
READ_TIMEOUT_MARGIN = 30.0
IDLE_FRACTION = 0.9
_IDLE_LIMIT = "relay_idle_limit"
_IDLE_SINCE = "relay_idle_since"


@dataclass(frozen=True, slots=True)
class ResolvedTarget:
    """A target as a SQLAlchemy URL, plus the database file when it is a SQLite file."""

    url: URL
    path: Path | None

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    def describe(self) -> str:
        """The target as messages show it: never a password (url_secrets.shown_url)."""
        return str(self.path) if self.path is not None else shown_url(self.url)


def resolve_target(target: Target) -> ResolvedTarget:
    """A path (str or PathLike) means a SQLite file; a string containing ``://`` is a URL."""
    if isinstance(target, str) and "://" in target:
        remember_secrets(target)  # for url_secrets.scrub, even if the URL is malformed
        url = _parse_url(target)
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


def _parse_url(target: str) -> URL:
    """``make_url`` with errors that say which part of the URL is wrong."""
    try:
        url = make_url(target)
    except ValueError as exc:  # make_url's int() of the port
        raise ProjectionError(
            f"invalid database URL: the port must be a number ({exc}); "
            "expected for example postgresql+psycopg://user@host:5432/dbname"
        ) from None
    except ArgumentError as exc:
        raise ProjectionError(f"invalid database URL: {exc}") from None
    backend, plus, driver = url.drivername.partition("+")
    if backend == "postgres":  # Heroku's and libpq's spelling (API.md accepts it)
        backend = "postgresql"
    if not plus:
        # The drivers this package installs (extras "postgresql", "mysql"), not
        # SQLAlchemy's defaults (psycopg2, mysqlclient), which need C headers.
        driver = _DEFAULT_DRIVERS.get(backend, "")
    drivername = f"{backend}+{driver}" if driver else backend
    return url if drivername == url.drivername else url.set(drivername=drivername)


_DEFAULT_DRIVERS = {"postgresql": "psycopg", "mysql": "pymysql", "mariadb": "pymysql"}


def check_sqlite_file(path: Path) -> None:
    """Refuse, without opening it, a file SQLite would reject or corrupt.

    Runs before SQLite sees the file so that a file that is not a database is
    left byte-for-byte untouched (no ``-wal``/``-shm`` appears beside it).
    A file another process is creating or checkpointing at this moment can look
    damaged for a few milliseconds (page 1 half written, the page count ahead of
    the file's size), so a bad verdict is judged again over about 0.3 s: a
    damaged file stays damaged, a healthy one settles.
    """
    if path.is_dir():
        raise NotAProjectionDatabase(f"{path} is a directory, not a SQLite database")
    for pause in (*_SETTLE_PAUSES, None):
        problem = _sqlite_file_problem(path)
        if problem is None:
            return
        if pause is None:
            raise NotAProjectionDatabase(problem)
        time.sleep(pause)


_SETTLE_PAUSES = (0.01, 0.02, 0.04, 0.08, 0.16)  # 0.31 s in all, only for a bad-looking file


def _sqlite_file_problem(path: Path) -> str | None:
    """Why *path* is not a usable SQLite file right now; None if it is (or is absent, empty)."""
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return f"{path} is a directory, not a SQLite database"
    except OSError as exc:
        raise ProjectionError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if size == 0:
        return None  # SQLite treats an empty file as an empty database
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return f"{path} is not a SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    if page_size < 512:
        return f"{path} is not a SQLite database (page size {page_size})"
    # While a -wal file exists the main file is not the whole database: another
    # process's checkpoint writes page 1 (the new page count) before the pages
    # that extend the file, so the sizes below disagree for a moment on a
    # healthy database. Only a database without a WAL can be judged by its size.
    if Path(f"{path}-wal").exists():
        return None
    if size % page_size or size < page_count * page_size:
        return (
            f"{path} is a truncated or damaged SQLite database "
            f"({size} bytes, header says {page_count} pages of {page_size})"
        )
    return None


# readable_target, check_url and url_error are used by the migration environment and
# the command line alike; they live here so that neither needs Alembic to use them.


def readable_target(resolved: ResolvedTarget) -> ResolvedTarget:
    """How a reading command opens *resolved*: as given, or, for a SQLite file in a
    directory this process cannot write, as an immutable read-only URI.

    SQLite in WAL mode must create ``<db>-shm`` even to read (``mode=ro`` alone
    fails with "unable to open database file"). Where the directory is not
    writable, nobody can be writing the database through it, so reading it as
    ``immutable`` is exact -- unless a ``-wal`` file with changes not yet
    checkpointed is there, which an immutable read would ignore: refused.
    """
    path = resolved.path
    if path is None or not path.exists() or os.access(path.parent, os.W_OK):
        return resolved
    check_sqlite_file(path)
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise ProjectionError(
            f"cannot read {path} read-only: its write-ahead log {wal} holds changes not yet "
            "written to the database and the directory is not writable; open it once "
            "where it is writable (or copy the three files elsewhere)"
        )
    url = URL.create(
        resolved.url.drivername,
        database=f"file:{path.resolve()}",
        query={"mode": "ro", "immutable": "1", "uri": "true"},
    )
    return ResolvedTarget(url, None)


def check_url(resolved: ResolvedTarget) -> ResolvedTarget:
    """*resolved*, unless a part of its URL can never work: a ``port`` given in the
    query string (``?port=...``, also a comma-separated list for several hosts)
    must be whole numbers, as the port after the host must (engine.resolve_target)."""
    given = resolved.url.query.get("port")
    values = (given,) if isinstance(given, str) else (given or ())
    for value in values:
        for port in value.split(","):
            if port and not port.strip().isdigit():
                raise ProjectionError(
                    f"invalid database URL: the port must be a number, got {port!r} "
                    "in ?port=; expected for example postgresql+psycopg://user@host:5432/dbname"
                )
    return resolved


def url_error(exc: ArgumentError) -> ProjectionError:
    """SQLAlchemy's refusal of a URL (at create_engine), as a ProjectionError.

    SQLAlchemy's own message names the part it refused; the parts that can be
    judged before it sees the URL are judged by check_url and resolve_target.
    """
    if isinstance(exc, NoSuchModuleError):  # a dialect or driver SQLAlchemy does not know
        return ProjectionError(
            f"invalid database URL: {exc}; relay-flow-projection supports sqlite://, "
            "postgresql+psycopg:// and mysql+pymysql:// (or mariadb+pymysql://)"
        )
    return ProjectionError(f"invalid database URL: {exc}")


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
        if path.exists() and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise ProjectionError(
                f"{path}: the database is read-only ({exc.strerror}); "
                "reading commands and has_nonterminal_runs() still work"
            ) from exc
        raise ProjectionError(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def _enter_wal_mode(cursor: sqlite3.Cursor, busy_timeout_ms: int) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds a lock.

    Switching a new database into WAL mode needs an exclusive lock, and SQLite
    answers "database is locked" at once, without the busy handler: processes
    initializing one new file together failed here. Once in WAL mode (it
    persists in the file) the pragma takes no lock and succeeds first time.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _install_sqlite_listeners(
    engine: Engine, *, foreign_keys: bool, read_only: bool, lock_timeout: float
) -> None:
    busy_timeout_ms = max(1, round(lock_timeout * 1000))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module: it would
        # otherwise begin DEFERRED transactions lazily before the first write,
        # so a read-then-write could not be atomic. `_on_begin` emits BEGIN.
        # (aiosqlite's adapted connection offers the same attribute.)
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # The whole lock budget; execution.py shortens it for one
            # transaction by what the in-process writer queue already used.
            cursor.execute(busy_timeout_pragma(lock_timeout))
            cursor.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
            if not read_only:
                _enter_wal_mode(cursor, busy_timeout_ms)
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
    back the extreme timestamps it accepted (year 1 under America/New_York).

    Runs once per new server session -- on a direct connection. Behind a
    transaction-pooling PgBouncer it reaches one server connection only; the
    stored values do not depend on it (timestamptz is absolute, and the bind
    and result processing in timestamps.py is zone-independent).
    """
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET TIME ZONE 'UTC'")
    finally:
        cursor.close()
    dbapi_connection.commit()


# Which extra installs the driver a URL asks for.
_DRIVER_EXTRAS = {
    "psycopg": "postgresql",
    "asyncpg": "asyncpg",
    "pymysql": "mysql",
    "aiomysql": "mysql,async",
    "aiosqlite": "async",
    "greenlet": "async",
}


def _missing_driver(exc: ImportError, url: URL) -> ProjectionError:
    module = (exc.name or "").split(".")[0]
    extra = _DRIVER_EXTRAS.get(module) or _DRIVER_EXTRAS.get(url.get_driver_name())
    if extra is None:
        return ProjectionError(
            f"the database driver for {url.drivername} is not installed ({_first_line(exc)}); "
            "relay-flow-projection supports sqlite, postgresql+psycopg, postgresql+asyncpg, "
            "mysql+pymysql, mariadb+pymysql and mysql+aiomysql"
        )
    return ExtraNotInstalled(
        f"the database driver for {url.drivername} is not installed ({_first_line(exc)}); "
        f'install it with pip install "relay-flow-projection[{extra}]"'
    )


def _first_line(exc: BaseException) -> str:
    """SQLAlchemy's missing-module messages run over several sentences and lines."""
    text = str(exc).strip()
    return text.splitlines()[0].split(". ")[0].strip() if text else type(exc).__name__


ASYNC_EXTRA_MISSING = (
    "the asyncio API needs the greenlet library, which is not installed; "
    'install it with pip install "relay-flow-projection[async]"'
)


def require_asyncio_extension() -> None:
    """ExtraNotInstalled, in one line, unless SQLAlchemy's asyncio extension can load.

    Without greenlet SQLAlchemy's own ImportError is a paragraph about
    ``sqlalchemy[asyncio]``; the extra that brings greenlet here is ``[async]``.
    """
    try:
        importlib.import_module("greenlet")
    except ImportError:
        raise ExtraNotInstalled(ASYNC_EXTRA_MISSING) from None


def _postgresql_connect_args(
    driver: str, connect_timeout: float, given: dict[str, Any]
) -> dict[str, Any]:
    """Connection arguments that are safe behind a transaction-pooling PgBouncer.

    Named server-side prepared statements live on one server connection, and
    a pooler hands each transaction whichever one is free: psycopg's automatic
    preparation (after 5 executions) and asyncpg's statement caches then
    collide across clients and can even answer with another statement's rows.
    They are off unless the caller passes its own values (the opt-in for a
    direct connection; README "Behind PgBouncer").

    asyncpg must still prepare every statement; it gets the *unnamed*
    statement. asyncpg sends its Parse with a Flush, not a Sync, so the pooler
    keeps the same server connection until the Bind that follows, and an
    unnamed statement needs no Close afterwards. A named statement (even with
    a unique name) does: asyncpg sends that Close with a Sync right before the
    next statement's Bind, the pooler may move the client to another server
    connection in between, and the Bind then failed ("prepared statement ...
    does not exist") -- under 40 concurrent tasks, half of all reads.
    """
    args = dict(given)
    if driver == "asyncpg":
        args.setdefault("timeout", connect_timeout)
        args.setdefault("statement_cache_size", 0)
        args.setdefault("prepared_statement_cache_size", 0)
        if not args["prepared_statement_cache_size"]:
            # A cached statement must keep its own name: the opt-in to
            # SQLAlchemy's statement cache keeps asyncpg's naming.
            args.setdefault("prepared_statement_name_func", _unnamed_statement)
    else:
        # libpq counts whole seconds and treats anything below 2 as 2.
        args.setdefault("connect_timeout", max(2, math.ceil(connect_timeout)))
        args.setdefault("prepare_threshold", None)
    return args


def _mysql_connect_args(
    driver: str, connect_timeout: float, read_timeout: float | None, given: dict[str, Any]
) -> dict[str, Any]:
    """PyMySQL's (and aiomysql's) arguments: bounded waits for a dead server, utf8mb4.

    Without a read timeout a client whose server vanished (a failover, a
    dropped route) waits for TCP to give up -- two hours and more. PyMySQL's
    ``read_timeout`` bounds every wait for a reply; it is set well above the
    longest a call may legitimately wait (its lock waits, bounded by
    lock_timeout). aiomysql has no read timeout (README, MySQL and MariaDB).
    """
    args = dict(given)
    args.setdefault("connect_timeout", connect_timeout)
    args.setdefault("charset", "utf8mb4")
    if driver == "pymysql" and read_timeout is not None:
        args.setdefault("read_timeout", read_timeout)
        args.setdefault("write_timeout", read_timeout)
    return args


def _unnamed_statement() -> str:
    return ""  # the protocol's unnamed prepared statement


def _check_timeouts(lock_timeout: float, connect_timeout: float) -> None:
    for name, value in (("lock_timeout", lock_timeout), ("connect_timeout", connect_timeout)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
        if not (0 < value < float("inf")):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def engine_arguments(
    resolved: ResolvedTarget,
    *,
    lock_timeout: float,
    connect_timeout: float,
    engine_kwargs: dict[str, Any],
    long_statements: bool = False,
) -> tuple[URL, dict[str, Any]]:
    """The URL and ``create_engine`` keyword arguments, for sync and async engines alike.

    *long_statements*: statements may run for minutes (the migrations' index
    builds), so no read timeout cuts them off.
    """
    _check_timeouts(lock_timeout, connect_timeout)
    kwargs = dict(engine_kwargs)
    options = dict(kwargs.pop("execution_options", None) or {})
    options.setdefault(LOCK_TIMEOUT_OPTION, float(lock_timeout))
    kwargs["execution_options"] = options
    url = resolved.url
    if url.get_backend_name() == "postgresql":
        kwargs["connect_args"] = _postgresql_connect_args(
            url.get_driver_name(), connect_timeout, kwargs.get("connect_args") or {}
        )
    elif is_mysql_url(url):
        read_timeout = None if long_statements else lock_timeout + READ_TIMEOUT_MARGIN
        kwargs["connect_args"] = _mysql_connect_args(
            url.get_driver_name(), connect_timeout, read_timeout, kwargs.get("connect_args") or {}
        )
        # READ COMMITTED: no gap locks on the ranges a statement reads, which
        # under REPEATABLE READ (the server's default) deadlocked concurrent
        # writers of neighbouring keys; every operation reads what it locks.
        kwargs.setdefault("isolation_level", "READ COMMITTED")
    return url, kwargs


def is_mysql_url(url: URL) -> bool:
    return url.get_backend_name() in MYSQL_DIALECTS


def prepare_sqlite_file(resolved: ResolvedTarget, *, read_only: bool) -> URL:
    """Check (and, for writing, create 0600) the SQLite file; the URL to open it with."""
    url = resolved.url
    if resolved.path is None:
        return url
    check_sqlite_file(resolved.path)
    if read_only:
        if not resolved.path.exists():
            raise ProjectionError(f"{resolved.path} does not exist")
        return URL.create(
            url.drivername,
            database=f"file:{resolved.path.resolve()}",
            query={"mode": "ro", "uri": "true"},
        )
    create_private_file(resolved.path)
    return url


def _install_mysql_listeners(engine: Engine, lock_timeout: float) -> None:
    """Session settings on every new connection, and no connection reused past the
    server's idle limit."""
    # Whole seconds: the server's lock waits take no fractions (at least 1 s).
    seconds = max(1, math.ceil(lock_timeout))
    settings = (
        "SET SESSION time_zone = '+00:00', "
        # Strict: an over-long or invalid value is an error, never truncated.
        "sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', "
        f"innodb_lock_wait_timeout = {int(seconds)}, lock_wait_timeout = {int(seconds)}"
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(settings)
            cursor.execute("SELECT @@SESSION.wait_timeout")
            (wait_timeout,) = cursor.fetchone()
        finally:
            cursor.close()
        record.info[_IDLE_LIMIT] = float(wait_timeout) * IDLE_FRACTION
        record.info.pop(_IDLE_SINCE, None)

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        # The server closes a connection idle for wait_timeout seconds (read
        # from the server: managed databases set it anywhere from minutes to
        # 8 h). One idle for most of that is replaced before it is used: the
        # pool catches DisconnectionError and connects anew.
        since = record.info.get(_IDLE_SINCE)
        limit = record.info.get(_IDLE_LIMIT)
        if since is not None and limit is not None and time.monotonic() - since >= limit:
            raise DisconnectionError("idle for most of the server's wait_timeout")


def install_listeners(
    engine: Engine, *, foreign_keys: bool, read_only: bool, lock_timeout: float
) -> None:
    if engine.dialect.name == "sqlite":
        _install_sqlite_listeners(
            engine, foreign_keys=foreign_keys, read_only=read_only, lock_timeout=lock_timeout
        )
    elif engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _utc_session)
    elif engine.dialect.name in MYSQL_DIALECTS:
        _install_mysql_listeners(engine, lock_timeout)


def build_engine(
    resolved: ResolvedTarget,
    *,
    foreign_keys: bool = True,
    read_only: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    long_statements: bool = False,
    **engine_kwargs: Any,
) -> Engine:
    """An engine for *resolved*; the SQLite file is checked (and created 0600) first."""
    url, kwargs = engine_arguments(
        resolved,
        lock_timeout=lock_timeout,
        connect_timeout=connect_timeout,
        engine_kwargs=engine_kwargs,
        long_statements=long_statements,
    )
    if resolved.is_sqlite:
        url = prepare_sqlite_file(resolved, read_only=read_only)
    try:
        engine = sqlalchemy.create_engine(url, **kwargs)
    except ImportError as exc:
        raise _missing_driver(exc, url) from None
    install_listeners(
        engine, foreign_keys=foreign_keys, read_only=read_only, lock_timeout=lock_timeout
    )
    track_for_fork(engine)
    return engine


def create_engine(
    target: Target,
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    **engine_kwargs: Any,
) -> Engine:
    """Public entry point (API.md): an engine with the project's connection settings."""
    return build_engine(
        resolve_target(target),
        lock_timeout=lock_timeout,
        connect_timeout=connect_timeout,
        **engine_kwargs,
    )


def create_async_engine(
    target: Target,
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    **engine_kwargs: Any,
) -> AsyncEngine:
    """API.md: an AsyncEngine with everything create_engine gives, on an async driver.

    A path or sqlite:///... runs on aiosqlite, postgresql:// and
    postgresql+psycopg:// on psycopg's asyncio mode, postgresql+asyncpg:// on
    asyncpg, mysql:// and mariadb:// (PyMySQL's URLs) on aiomysql. The listeners
    are the sync engine's: SQLAlchemy runs them inside the greenlet that drives
    the async driver.
    """
    require_asyncio_extension()
    resolved = resolve_target(target)
    if is_mysql_url(resolved.url) and resolved.url.get_driver_name() == "pymysql":
        async_url = resolved.url.set(drivername=f"{resolved.url.get_backend_name()}+aiomysql")
        resolved = ResolvedTarget(async_url, None)
    url, kwargs = engine_arguments(
        resolved,
        lock_timeout=lock_timeout,
        connect_timeout=connect_timeout,
        engine_kwargs=engine_kwargs,
    )
    if resolved.is_sqlite:
        url = prepare_sqlite_file(resolved, read_only=False)
        if url.get_driver_name() in ("", "pysqlite"):
            url = url.set(drivername="sqlite+aiosqlite")
        if resolved.path is not None and "pool" not in kwargs:
            # SQLAlchemy's default since 2.0.38; before it, aiosqlite files got a
            # NullPool: a new connection (and driver thread) for every call.
            kwargs.setdefault("poolclass", AsyncAdaptedQueuePool)
    try:
        from sqlalchemy.ext.asyncio import create_async_engine as sqlalchemy_async_engine

        engine = sqlalchemy_async_engine(url, **kwargs)
    except ImportError as exc:
        raise _missing_driver(exc, url) from None
    install_listeners(
        engine.sync_engine, foreign_keys=True, read_only=False, lock_timeout=lock_timeout
    )
    track_for_fork(engine.sync_engine)
    return engine
