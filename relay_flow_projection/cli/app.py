"""The command group, its global options and the console-script entry point."""

from __future__ import annotations

from typing import Any

import click

from .errors import PROG_NAME, one_line_errors
from .identity_commands import identity
from .options import Settings, global_db_option
from .run_commands import runs, status
from .schema_commands import check, current, init, upgrade
from .sweep_command import sweep


class ProjectionGroup(click.Group):
    """A group whose every failure is one line on stderr with the documented exit code."""

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
@click.version_option(package_name="relay-flow-projection", prog_name=PROG_NAME)
@click.pass_context
def cli(ctx: click.Context, target: str) -> None:
    """Look at and maintain relay-flow's run projection (SQLite or PostgreSQL).

    Exit codes: 0 ok; 1 not found, mismatch or not at head; 2 usage or bad input.
    """
    ctx.obj = Settings(target)


for command in (init, upgrade, current, check, status, runs, sweep, identity):
    cli.add_command(command)


def main() -> None:
    """The ``relay-flow-projection`` console script."""
    cli.main(prog_name=PROG_NAME)
