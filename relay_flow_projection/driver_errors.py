"""The one translation of driver errors into the errors of API.md.

Every driver and SQLAlchemy exception an operation, the CLI or the migration
environment sees goes through ``translate_error``: by SQLite result code,
PostgreSQL SQLSTATE and MySQL error number wherever the driver gives one, never
by message text except where a driver gives nothing else. The retry policy
(execution.py) asks the same module what a failure was (``is_deadlock``,
``is_lock_wait``) so that the two can never disagree.

``CommitOutcomeUnknown`` is the one failure that is not a driver's: the
connection was lost while a write's COMMIT was on its way (API.md,
*Ambiguous commits*).
"""

from __future__ import annotations

import re
import sqlite3
import sys
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from .errors import (
    DatabaseBusy,
    DatabaseUnavailable,
    NotAProjectionDatabase,
    ProjectionError,
    RunNotFound,
    SchemaOutOfDate,
)
from .url_secrets import scrub


class CommitOutcomeUnknown(Exception):
    """The connection was lost after a write's COMMIT was sent, before its answer.

    The server may have committed or not; the executor must not run the write
    again blindly (it could undo what another caller wrote meanwhile). It asks
    the operation to settle the outcome, or raises ``DatabaseUnavailable``
    saying the outcome is unknown (translate_error).
    """

    def __init__(self, lost: DBAPIError) -> None:
        super().__init__(str(lost.orig) if lost.orig is not None else str(lost))
        self.lost = lost


# SQLite primary result codes (the low byte of an extended code).
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 5, 6, 8
_SQLITE_CONSTRAINT_FOREIGNKEY = 787

_SQLSTATE_FOREIGN_KEY = "23503"
_SQLSTATES_MISSING_SCHEMA = ("42P01", "42703")  # undefined table / column
# lock_not_available (lock_timeout), query_canceled (statement_timeout),
# serialization failure, deadlock: someone else held what this call needed.
_SQLSTATES_BUSY = ("55P03", "57014", "40001", "40P01")
# admin/crash shutdown, cannot connect now, too many connections, a standby
# that refuses writes after a failover.
_SQLSTATES_UNAVAILABLE = ("57P01", "57P02", "57P03", "53300", "25006")


# MySQL/MariaDB error numbers (the first argument of PyMySQL's and aiomysql's errors).
_MYSQL_DEADLOCK = 1213
_MYSQL_LOCK_WAIT_TIMEOUT = 1205  # row locks and metadata locks alike
_MYSQL_BUSY = (_MYSQL_LOCK_WAIT_TIMEOUT, _MYSQL_DEADLOCK)
_MYSQL_MISSING_SCHEMA = (1146, 1054)  # no such table / column
_MYSQL_FOREIGN_KEY = 1452
# Data too long, incorrect string / datetime / integer value, out of range,
# truncated, NULL into NOT NULL: the value, not the database, is wrong.
_MYSQL_BAD_VALUE = (1406, 1366, 1292, 1264, 1265, 1367, 1048)
# Cannot connect (socket, TCP, host), server gone / connection lost, killed,
# shutting down, too many connections, a read-only server (a demoted primary).
_MYSQL_UNAVAILABLE = (2002, 2003, 2005, 2006, 2013, 2014, 2055, 1927, 4031, 1053, 1040, 1290)
# Access denied (user, password, database grant, auth plugin), unknown database:
# calling again cannot help.
_MYSQL_REFUSED_LOGIN = (1044, 1045, 1698)
_MYSQL_UNKNOWN_DATABASE = 1049


def _first_line(orig: object) -> str:
    """A driver message's first line (PostgreSQL adds DETAIL and HINT lines)."""
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def _sqlite_code(orig: BaseException) -> int | None:
    code = getattr(orig, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def translate_error(
    exc: BaseException,
    subject: str,
    *,
    missing_run: str | None = None,
    lock_timeout: float | None = None,
) -> BaseException:
    """The API.md error for a driver or SQLAlchemy exception raised during *subject*.

    The one place that maps driver errors, by SQLite result code, PostgreSQL
    SQLSTATE and MySQL error number wherever the driver gives one; a value the
    database refuses (MySQL's strict mode) is a ``ValueError``. Errors of this package
    pass through unchanged; anything unrecognised becomes a ``ProjectionError``
    naming *subject*. No message carries a password (url_secrets.scrub).
    """
    error = _translate(exc, subject, missing_run, lock_timeout)
    return error if error is exc else _without_secrets(error)


def _without_secrets(error: BaseException) -> BaseException:
    """*error* (made here) with every password this process was given masked: a
    driver's text may echo a connection string."""
    message = str(error)
    clean = scrub(message)
    return error if clean == message else type(error)(clean)


def _translate(
    exc: BaseException, subject: str, missing_run: str | None, lock_timeout: float | None
) -> BaseException:
    if isinstance(exc, ProjectionError):
        return exc
    if isinstance(exc, CommitOutcomeUnknown):
        return DatabaseUnavailable(
            f"{subject}: the connection was lost while the write was committing, so "
            "whether the write committed is unknown (it is safe to call again): "
            f"{_first_line(exc.lost.orig)}"
        )
    waited = "" if lock_timeout is None else f" within lock_timeout ({lock_timeout:g} s)"
    if isinstance(exc, PoolTimeout):
        return DatabaseBusy(f"{subject}: no pooled connection became free{waited}: {exc}")
    if _unwrapped_driver_error(exc):
        return _translate_driver_error(exc, exc, subject, missing_run, waited)
    if not isinstance(exc, DBAPIError):
        if isinstance(exc, TimeoutError | OSError):  # asyncpg's connect raises these bare
            return DatabaseUnavailable(f"{subject}: the database cannot be reached: {exc!r}")
        if isinstance(exc, SQLAlchemyError):
            return ProjectionError(f"{subject}: {exc}")
        return exc
    return _translate_driver_error(exc, exc.orig, subject, missing_run, waited)


def _unwrapped_driver_error(exc: BaseException) -> bool:
    """A driver error SQLAlchemy did not wrap in ``DBAPIError``.

    Raised by a DBAPI cursor used directly (PRAGMA), or by a driver call in a
    ``before_cursor_execute`` listener: SQLAlchemy 2.0 runs those listeners
    outside the block that wraps driver errors (2.1 inside). SQLAlchemy 2.0's
    asyncpg dialect also lets the server's refusal of a login escape from
    ``connect`` as asyncpg's own exception (it carries the SQLSTATE).
    """
    if isinstance(exc, sqlite3.Error):
        return True
    return (
        _psycopg_error(exc, "Error")
        or _mysql_code(exc) is not None
        or _imported_driver_error("asyncpg", exc, "PostgresError")
    )


def _mysql_code(value: object) -> int | None:
    """The MySQL error number of one of PyMySQL's exceptions (aiomysql raises them
    too); looked up only if something already imported PyMySQL."""
    pymysql = sys.modules.get("pymysql")
    if pymysql is None or not isinstance(value, pymysql.err.MySQLError):
        return None
    code = value.args[0] if value.args else None
    return code if isinstance(code, int) else None


def is_deadlock(orig: object) -> bool:
    """The server broke a deadlock by rolling this transaction back (all of it)."""
    return getattr(orig, "sqlstate", None) == "40P01" or _mysql_code(orig) == _MYSQL_DEADLOCK


def is_lock_wait(orig: object) -> bool:
    """The statement gave up waiting for a lock (lock_timeout, MySQL's lock wait
    timeouts), or lost a deadlock: nothing of its transaction committed."""
    return (
        is_deadlock(orig)
        or getattr(orig, "sqlstate", None) == "55P03"
        or _mysql_code(orig) == _MYSQL_LOCK_WAIT_TIMEOUT
    )


def _psycopg_error(value: object, *classes: str) -> bool:
    """*value* is one of psycopg's exception *classes*."""
    return _imported_driver_error("psycopg", value, *classes)


def _imported_driver_error(module_name: str, value: object, *classes: str) -> bool:
    """*value* is one of the exception *classes* of driver *module_name*. Drivers
    are optional extras, so one is looked up only if something already imported it."""
    module = sys.modules.get(module_name)
    return module is not None and isinstance(
        value, tuple(getattr(module, name) for name in classes)
    )


def _translate_driver_error(
    exc: BaseException, orig: Any, subject: str, missing_run: str | None, waited: str
) -> BaseException:
    text = _first_line(orig)
    code = _sqlite_code(orig)
    if code is not None or isinstance(orig, sqlite3.Error):
        primary = None if code is None else code & 0xFF
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return DatabaseBusy(
                f"{subject}: the SQLite database stayed locked by another connection{waited}"
            )
        if code == _SQLITE_CONSTRAINT_FOREIGNKEY and missing_run is not None:
            return RunNotFound(f"run {missing_run!r} not found")
        if primary in (_SQLITE_NOTADB, _SQLITE_CORRUPT):
            return NotAProjectionDatabase(f"{subject}: not a usable SQLite database: {text}")
        if primary == _SQLITE_READONLY:
            return ProjectionError(f"{subject}: the database is read-only ({text})")
        if "no such table" in text or "no such column" in text:  # SQLITE_ERROR has no subcode
            return _schema_out_of_date(subject)
        return ProjectionError(f"{subject}: {text}")
    mysql_code = _mysql_code(orig)
    if mysql_code is not None:
        return _translate_mysql_error(exc, mysql_code, orig, subject, missing_run, waited)
    sqlstate = getattr(orig, "sqlstate", None)
    refused = refused_login(orig, sqlstate, text)
    if refused is not None:
        return ProjectionError(f"{subject}: {refused}")
    if sqlstate == _SQLSTATE_FOREIGN_KEY and missing_run is not None:
        return RunNotFound(f"run {missing_run!r} not found")
    if sqlstate in _SQLSTATES_MISSING_SCHEMA:
        return _schema_out_of_date(subject)
    if sqlstate in _SQLSTATES_BUSY:
        return DatabaseBusy(f"{subject}: a lock held by another session was not released{waited}")
    if (
        (isinstance(exc, DBAPIError) and exc.connection_invalidated)
        or sqlstate in _SQLSTATES_UNAVAILABLE
        or (isinstance(sqlstate, str) and sqlstate.startswith("08"))
        # psycopg reports refused, timed-out and closed connections without a SQLSTATE
        or (sqlstate is None and _connection_failure(exc, orig))
    ):
        return DatabaseUnavailable(f"{subject}: the database is unavailable: {text}")
    return ProjectionError(f"{subject}: {text}")


# PostgreSQL's answers to a login that can never succeed: calling again cannot help.
_SQLSTATE_LOGIN_REFUSED = {
    "3D000": "the database does not exist",  # invalid_catalog_name
    "28000": "the server refused the login",  # invalid_authorization_specification
    "28P01": "the server refused the password",  # invalid_password
}
# psycopg reports failures while connecting with libpq's text alone (no SQLSTATE):
# the server's FATAL line, in English unless the server's lc_messages says otherwise.
_LIBPQ_LOGIN_REFUSED = (
    (re.compile(r'FATAL:\s+database "[^"]*" does not exist'), "3D000"),
    (re.compile(r'FATAL:\s+role "[^"]*" does not exist'), "28000"),
    (re.compile(r'FATAL:\s+password authentication failed for user "[^"]*"'), "28P01"),
    (re.compile(r"FATAL:\s+no pg_hba\.conf entry for "), "28000"),
)


def refused_login(orig: object, sqlstate: object, text: str) -> str | None:
    """What does not exist, or refused, when a PostgreSQL login cannot succeed (None
    otherwise): the same answer on psycopg (sync and asyncio) and asyncpg.

    By SQLSTATE where the driver gives one (asyncpg, psycopg after connecting); for
    psycopg's connection-time failures, which carry no SQLSTATE, by the server's
    FATAL line in libpq's message. The message names the database or role the
    server named, never a password (the caller's subject shows the URL masked).
    """
    if sqlstate is None and _psycopg_error(orig, "OperationalError"):
        for pattern, code in _LIBPQ_LOGIN_REFUSED:
            found = pattern.search(str(orig))
            if found is not None:
                return (
                    f"{_SQLSTATE_LOGIN_REFUSED[code]} ({found[0].removeprefix('FATAL:').strip()})"
                )
        return None
    if not isinstance(sqlstate, str) or sqlstate not in _SQLSTATE_LOGIN_REFUSED:
        return None
    return f"{_SQLSTATE_LOGIN_REFUSED[sqlstate]} ({text})"


def _translate_mysql_error(
    exc: BaseException,
    code: int,
    orig: BaseException,
    subject: str,
    missing_run: str | None,
    waited: str,
) -> BaseException:
    text = str(orig.args[1]) if len(orig.args) > 1 else str(orig)
    if code == _MYSQL_FOREIGN_KEY and missing_run is not None:
        return RunNotFound(f"run {missing_run!r} not found")
    if code in _MYSQL_MISSING_SCHEMA:
        return _schema_out_of_date(subject)
    if code in _MYSQL_BUSY:
        return DatabaseBusy(f"{subject}: a lock held by another session was not released{waited}")
    if code in _MYSQL_BAD_VALUE:
        return ValueError(f"{subject}: the database refused a value: {text}")
    if code == _MYSQL_UNKNOWN_DATABASE:
        return ProjectionError(f"{subject}: the database does not exist ({text})")
    if code in _MYSQL_REFUSED_LOGIN:
        return ProjectionError(
            f"{subject}: the server refused the login ({text}); check the user, "
            "its password and its grants"
        )
    if code in _MYSQL_UNAVAILABLE or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return DatabaseUnavailable(f"{subject}: the database is unavailable: {text}")
    return ProjectionError(f"{subject}: {text}")


def _connection_failure(exc: BaseException, orig: Any) -> bool:
    """An OperationalError or InterfaceError: SQLAlchemy's wrapper, or psycopg's own
    when nothing wrapped it (cli/quick_revision connects with psycopg alone)."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return _psycopg_error(orig, "OperationalError", "InterfaceError")


def _schema_out_of_date(subject: str) -> SchemaOutOfDate:
    return SchemaOutOfDate(
        f"the projection tables are missing or incomplete ({subject}); "
        "run `alembic upgrade head` or relay_flow_projection.upgrade()"
    )
