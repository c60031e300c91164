"""Errors as one line on stderr, and the exit codes of the command line.

Each class of failure has its own exit code, so that a script or a deploy
step can tell them apart without reading the message:

====  ==========================================================================
exit  meaning
====  ==========================================================================
0     ok
1     any other failure: identity mismatch, ``upgrade``/``downgrade`` to where
      the database already is (or the wrong way), a missing driver, a database,
      role or password that does not exist, ...
2     usage or bad input: unknown command or option, bad duration or identity,
      a file that is not a SQLite database, a malformed URL, a database of an
      unknown shape, a data-deleting ``downgrade`` without ``--yes``
3     not found: the run (RunNotFound), the node runtime (NodeRuntimeNotFound),
      the identity marker (IdentityMissing), the SQLite database file
4     not at head (SchemaOutOfDate), including a revision written by a newer
      release: run ``upgrade``, or upgrade the package
5     drift: ``check`` found differences between the database and the models
75    retryable: the database is unavailable or busy (DatabaseUnavailable,
      DatabaseBusy); EX_TEMPFAIL of sysexits.h -- try again later
130   interrupted (Ctrl-C)
====  ==========================================================================

Output piped into a reader that stops early (``runs list --all | head``)
ends quietly with 0. No traceback reaches the operator. Driver errors are
mapped by the package's one translator (driver_errors.translate_error), by type
and error code, never by their text. SQLAlchemy is imported only when an
error needs it: ``--help`` must start fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click

PROG_NAME = "relay-flow-projection"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_NOT_AT_HEAD = 4
EXIT_DRIFT = 5
EXIT_RETRYABLE = 75  # EX_TEMPFAIL (sysexits.h): unavailable or busy, try again later
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended


def one_line(message: str) -> str:
    """Driver messages span lines (PostgreSQL adds hints); the operator gets one."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


class CliError(click.ClickException):
    """A failure shown as ``relay-flow-projection: error: <message>``; exit code 1
    unless *exit_code* says otherwise."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(one_line(message) or "failed")
        if exit_code is not None:
            vars(self)["exit_code"] = exit_code  # click declares it a ClassVar; per error here

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{PROG_NAME}: error: {self.format_message()}", file=file, err=True)


class BadInput(CliError):
    """Usage or bad input, shown the same way; exit code 2."""

    exit_code = EXIT_USAGE


class NotFound(CliError):
    """Something the command needs does not exist (a database file); exit code 3."""

    exit_code = EXIT_NOT_FOUND


class Drift(CliError):
    """``check`` found differences between the database and the models; exit code 5."""

    exit_code = EXIT_DRIFT


def _bad_input() -> tuple[type[BaseException], ...]:
    """Bad input: the operator gave something that can never work as given."""
    from ..errors import InvalidIdentity, NotAProjectionDatabase

    # ValueError: a value the operator typed (InvalidIdentity is one too);
    # NotImplementedError: a database other than SQLite, PostgreSQL or MySQL.
    return (InvalidIdentity, NotAProjectionDatabase, ValueError, NotImplementedError)


def exit_code_for(exc: BaseException) -> int:
    """The exit code of the table above for *exc*."""
    if isinstance(exc, click.ClickException):
        return exc.exit_code
    from ..errors import (
        DatabaseBusy,
        DatabaseUnavailable,
        IdentityMissing,
        NodeRuntimeNotFound,
        RunNotFound,
        SchemaOutOfDate,
    )

    if isinstance(exc, RunNotFound | NodeRuntimeNotFound | IdentityMissing):
        return EXIT_NOT_FOUND
    if isinstance(exc, SchemaOutOfDate):
        return EXIT_NOT_AT_HEAD
    if isinstance(exc, DatabaseUnavailable | DatabaseBusy):
        return EXIT_RETRYABLE
    return EXIT_USAGE if isinstance(exc, _bad_input()) else EXIT_FAILURE


def translate(exc: BaseException, subject: str) -> BaseException:
    """The error to show for *exc*, raised while *subject*.

    Driver and SQLAlchemy errors go through driver_errors.translate_error (the
    package's one translator); a URL SQLAlchemy refuses is bad input naming
    the part that is wrong (migration_env.url_error). Everything else, the
    package's own errors included, is shown as it is.
    """
    import sqlite3

    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    if isinstance(exc, ArgumentError):
        from ..migration_env import url_error

        return BadInput(str(url_error(exc)))
    if isinstance(exc, SQLAlchemyError | sqlite3.Error):
        from ..driver_errors import translate_error

        return translate_error(exc, subject)
    return exc


def _message(exc: BaseException) -> str:
    if isinstance(exc, click.ClickException):
        return exc.format_message()
    from ..errors import ProjectionError

    if isinstance(exc, ProjectionError | ValueError | OSError | NotImplementedError):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {exc}"


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing what is still buffered for a reader
    that went away (a closed pipe) neither fails again nor prints "Exception ignored"."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # no real stdout (a test runner's buffer): nothing is left to flush


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn every failure inside the block into a :class:`CliError`."""
    try:
        yield
    except (CliError, click.exceptions.Exit, click.exceptions.Abort):
        raise
    except click.exceptions.NoArgsIsHelpError:
        raise  # shows the help text, which is what the operator asked for
    except BrokenPipeError:
        # `... | head`: the reader has what it wanted; end quietly with 0.
        silence_stdout()
        raise click.exceptions.Exit(EXIT_OK) from None
    except KeyboardInterrupt:
        # Ctrl-C: one line and 130, not click's "Aborted!" with exit code 1.
        click.echo(f"{PROG_NAME}: interrupted", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    except click.ClickException as exc:
        raise _shown(exc) from exc
    except Exception as exc:
        error = translate(exc, "database error")
        raise _shown(error) from error


def _shown(error: BaseException) -> CliError:
    return CliError(_message(error), exit_code_for(error))
