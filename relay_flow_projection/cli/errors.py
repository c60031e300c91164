"""Errors as one line on stderr, and the exit codes of the command line.

0 ok; 1 not found, mismatch, not at head or another database failure
(DatabaseUnavailable, DatabaseBusy included); 2 usage or bad input; 130
interrupted (Ctrl-C). No traceback reaches the operator. Driver errors are
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
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended


def one_line(message: str) -> str:
    """Driver messages span lines (PostgreSQL adds hints); the operator gets one."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


class CliError(click.ClickException):
    """A failure shown as ``relay-flow-projection: error: <message>``; exit code 1."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message) or "failed")

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"{PROG_NAME}: error: {self.format_message()}", file=file, err=True)


class BadInput(CliError):
    """Usage or bad input, shown the same way; exit code 2."""

    exit_code = EXIT_USAGE


def _bad_input() -> tuple[type[BaseException], ...]:
    """Bad input: the operator gave something that can never work as given."""
    from ..errors import InvalidIdentity, NotAProjectionDatabase

    # ValueError: a value the operator typed (InvalidIdentity is one too);
    # NotImplementedError: a database other than SQLite or PostgreSQL.
    return (InvalidIdentity, NotAProjectionDatabase, ValueError, NotImplementedError)


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, click.ClickException):
        return exc.exit_code
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
        raise  # `... | head`: click's main() ends quietly, as other commands do
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
    message = _message(error)
    return BadInput(message) if exit_code_for(error) == EXIT_USAGE else CliError(message)
