"""``init``: create the database, upgrade it to head, and write the executor identity.

Apart from the schema commands because its options need the identity module,
which loads SQLAlchemy: ``current`` must not pay for that (start-up time).
"""

from __future__ import annotations

import click

from ..identity import EXECUTOR_PLUGINS
from ..models import ExecutorIdentity
from .access import read_revision, resolve
from .options import Settings, db_option, pass_settings
from .schema_commands import revision_text
from .textview import identity_text


def identity_options(f: click.decorators.FC) -> click.decorators.FC:
    """``--executor`` and its Temporal settings, as relay-flow's configuration names them."""
    for option in reversed(
        (
            click.option(
                "--executor",
                type=click.Choice(EXECUTOR_PLUGINS),
                help="Executor plugin of the relay-flow installation.",
            ),
            click.option("--temporal-address", default="", metavar="ADDRESS", help="host:port"),
            click.option("--temporal-namespace", default="", metavar="NAMESPACE"),
        )
    ):
        f = option(f)
    return f


def identity_from_options(
    executor: str | None, temporal_address: str, temporal_namespace: str
) -> ExecutorIdentity | None:
    if executor is None:
        if temporal_address or temporal_namespace:
            raise click.UsageError("--temporal-address/--temporal-namespace need --executor")
        return None
    return ExecutorIdentity(executor, temporal_address, temporal_namespace)


@click.command()
@identity_options
@db_option
@pass_settings
def init(
    settings: Settings, executor: str | None, temporal_address: str, temporal_namespace: str
) -> None:
    """Create the database if needed and upgrade it to head.

    With --executor, also write the executor identity marker (or verify the
    one already there).
    """
    from ..database import init_database, init_database_with_identity

    identity = identity_from_options(executor, temporal_address, temporal_namespace)
    resolve(settings.target)  # a malformed URL is bad input (exit 2), before anything runs
    before = read_revision(settings.target, missing_ok=True)
    if identity is None:
        init_database(settings.target)
    else:
        init_database_with_identity(settings.target, identity)
    revision = read_revision(settings.target)
    if before.at_head:
        click.echo(f"{revision.database} was already initialized, at {revision_text(revision)}")
    else:
        click.echo(f"initialized {revision.database} at revision {revision_text(revision)}")
    if identity is not None:
        click.echo(f"executor identity: {identity_text(identity)}")
