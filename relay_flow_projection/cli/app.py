"""The command group, its global options and the console-script entry point.

Commands are imported when they run, not when the group is built: ``--help``
lists them from the short descriptions below without importing SQLAlchemy,
Alembic or the repository (start-up time, README "Command line").
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from .errors import EXIT_OK, PROG_NAME, one_line_errors, silence_stdout
from .options import Settings, global_db_option, global_json_option

# name: (module in this package, attribute, short help shown by --help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("init_command", "init", "Create the database if needed and upgrade it to head."),
    "upgrade": ("schema_commands", "upgrade", "Upgrade the database to REVISION (default: head)."),
    "downgrade": ("schema_commands", "downgrade", "Downgrade the database to REVISION."),
    "current": ("schema_commands", "current", "Show the database's revision."),
    "check": ("schema_commands", "check", "Exit 0 if at head and matching the models."),
    "history": ("schema_commands", "history", "The revisions of this release, newest first."),
    "status": ("run_commands", "status", "Revision, identity, runs per state, oldest active."),
    "runs": ("run_commands", "runs", "List and show runs."),
    "sweep": (
        "sweep_command",
        "sweep",
        "Delete completed and canceled runs older than --older-than.",
    ),
    "identity": ("identity_commands", "identity", "The executor identity marker."),
}


class ProjectionGroup(click.Group):
    """A group whose every failure is one line on stderr with the documented exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
        assert isinstance(command, click.Command)
        self.commands[cmd_name] = command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors():
            return super().invoke(ctx)


@click.group(cls=ProjectionGroup, context_settings={"help_option_names": ["-h", "--help"]})
@global_db_option
@global_json_option
@click.version_option(package_name="relay-flow-projection", prog_name=PROG_NAME)
@click.pass_context
def cli(ctx: click.Context, target: str, as_json: bool) -> None:
    """Look at and maintain relay-flow's run projection (SQLite or PostgreSQL).

    --db and --json may be given before or after the command name.

    Exit codes: 0 ok; 1 other failure; 2 usage or bad input; 3 not found;
    4 not at head; 5 drift (check); 75 unavailable or busy, retry later;
    130 interrupted.
    """
    ctx.obj = Settings(target, as_json)
    if as_json and ctx.invoked_subcommand is not None:
        _require_json_output(ctx, ctx.invoked_subcommand)


def _require_json_output(ctx: click.Context, name: str) -> None:
    """``--json`` before a command that prints no JSON is refused, not ignored."""
    group = ctx.command
    command = group.get_command(ctx, name) if isinstance(group, click.Group) else None
    if command is None or isinstance(command, click.Group):
        return  # an unknown command is reported by click; a group's commands all take --json
    if not any(param.name == "as_json" for param in command.params):
        raise click.UsageError(f"`{name}` has no JSON output (--json)")


def main() -> None:
    """The ``relay-flow-projection`` console script."""
    try:
        cli.main(prog_name=PROG_NAME)
    finally:
        _flush_for_a_reader_that_left()


def _flush_for_a_reader_that_left() -> None:
    """Output still buffered when the reader closed the pipe (``| head``) ends quietly:
    flushed here, not at interpreter exit (exit code 120, "Exception ignored")."""
    import sys

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        raise SystemExit(EXIT_OK) from None
