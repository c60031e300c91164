"""Errors as one line on stderr, and the exit codes of the command line.

0 ok; 1 not found, mismatch, not at head or another database failure;
2 usage or bad input. No traceback reaches the operator.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from ..errors import InvalidIdentity, NotAProjectionDatabase, ProjectionError

PROG_NAME = "relay-flow-projection"
EXIT_FAILURE = 1
EXIT_USAGE = 2

# Bad input: the operator gave something that can never work as given.
_BAD_INPUT = (
    InvalidIdentity,
    NotAProjectionDatabase,
    ValueError,
    ArgumentError,
    NoSuchModuleError,
    NotImplementedError,
    ImportError,
)


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


def cli_error(message: str, exit_code: int) -> CliError:
    return BadInput(message) if exit_code == EXIT_USAGE else CliError(message)


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, _BAD_INPUT):
        return EXIT_USAGE
    return EXIT_FAILURE


def _message(exc: BaseException) -> str:
    if isinstance(exc, DBAPIError):
        return f"database error: {exc.orig}"
    if isinstance(exc, ProjectionError | ValueError | click.ClickException):
        return str(exc.format_message() if isinstance(exc, click.ClickException) else exc)
    if isinstance(exc, SQLAlchemyError | OSError | NotImplementedError | ImportError):
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
    except click.ClickException as exc:
        raise cli_error(_message(exc), exc.exit_code) from exc
    except Exception as exc:
        raise cli_error(_message(exc), exit_code_for(exc)) from exc
