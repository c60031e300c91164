"""Schema commands: ``init``, ``upgrade``, ``current``, ``check``."""

from __future__ import annotations

import re

import click
from alembic.util import CommandError

from .. import migrate
from ..database import init_database, init_database_with_identity
from ..database import upgrade as upgrade_database
from ..identity import EXECUTOR_PLUGINS
from ..models import ExecutorIdentity
from .access import Revision, out_of_date, read_revision, schema_drift
from .errors import CliError
from .jsonview import echo_json
from .options import Settings, db_option, json_option, pass_settings
from .textview import identity_text


def revision_text(revision: Revision) -> str:
    if revision.current is None:
        return f"no revision (not initialized; head is {revision.head})"
    if revision.at_head:
        return f"{revision.current} (head)"
    return f"{revision.current} (not at head {revision.head})"


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
    identity = identity_from_options(executor, temporal_address, temporal_namespace)
    if identity is None:
        init_database(settings.target)
    else:
        init_database_with_identity(settings.target, identity)
    revision = read_revision(settings.target)
    click.echo(f"initialized {revision.database} at revision {revision_text(revision)}")
    if identity is not None:
        click.echo(f"executor identity: {identity_text(identity)}")


def _check_revision_argument(revision: str) -> None:
    if re.search(r"[+-]\d", revision):
        return  # relative steps ("+1") are resolved against the database by Alembic
    try:
        migrate.script_directory().get_revisions(revision)
    except CommandError as exc:
        raise click.BadParameter(str(exc), param_hint="REVISION") from None


@click.command()
@click.argument("revision", default="head")
@db_option
@pass_settings
def upgrade(settings: Settings, revision: str) -> None:
    """Upgrade the database to REVISION (default: head), creating it if needed."""
    _check_revision_argument(revision)
    before = read_revision(settings.target, missing_ok=True)
    upgrade_database(settings.target, revision)
    after = read_revision(settings.target)
    if before.current == after.current:
        click.echo(f"{after.database} is already at {revision_text(after)}")
    else:
        click.echo(
            f"upgraded {after.database} from {before.current or '(none)'} to {revision_text(after)}"
        )


def revision_json(revision: Revision) -> dict[str, object]:
    return {
        "database": revision.database,
        "revision": revision.current,
        "head": revision.head,
        "at_head": revision.at_head,
    }


@click.command()
@db_option
@json_option
@pass_settings
def current(settings: Settings, as_json: bool) -> None:
    """Show the database's revision and whether it is the head."""
    revision = read_revision(settings.target)
    if as_json:
        echo_json(revision_json(revision))
    else:
        click.echo(f"{revision.database}: {revision_text(revision)}")


def describe_diff(diff: object) -> str:
    """One Alembic diff (a tuple, or a list of column changes) as a short line."""
    if isinstance(diff, list):
        return "; ".join(describe_diff(part) for part in diff)
    if not isinstance(diff, tuple) or not diff:
        return str(diff)
    kind, *details = diff
    words = [str(kind)]
    for detail in details:
        if detail is None or isinstance(detail, dict):
            continue
        table = getattr(detail, "table", None)
        name = getattr(detail, "name", None)
        if name is not None and table is not None and hasattr(table, "name"):
            words.append(f"{table.name}.{name}")
        elif name is not None:
            words.append(str(name))
        else:
            words.append(str(detail))
    return " ".join(words)


@click.command()
@db_option
@json_option
@pass_settings
def check(settings: Settings, as_json: bool) -> None:
    """Exit 1 unless the database is at head and matches the models (`alembic check`)."""
    revision = read_revision(settings.target)
    drift = (
        [describe_diff(diff) for diff in schema_drift(settings.target)] if revision.at_head else []
    )
    if as_json:
        echo_json({**revision_json(revision), "drift": drift, "ok": revision.at_head and not drift})
    else:
        for line in drift:
            click.echo(f"drift: {line}")
    if not revision.at_head:
        raise out_of_date(revision)
    if drift:
        raise CliError(
            f"{revision.database} drifts from the models ({len(drift)} difference"
            f"{'' if len(drift) == 1 else 's'})"
        )
    if not as_json:
        click.echo(f"{revision.database}: at head {revision.head}, no drift")
