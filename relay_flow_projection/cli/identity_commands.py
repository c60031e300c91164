"""``identity show`` and ``identity verify``: the executor identity marker."""

from __future__ import annotations

import click

from ..errors import IdentityMismatch, IdentityMissing
from ..identity import EXECUTOR_PLUGINS, validate_identity
from ..models import ExecutorIdentity
from ..operations import require_same_identity
from .access import projection_at_head
from .jsonview import echo_json, identity_json
from .options import Settings, db_option, json_option, pass_settings
from .textview import identity_text


@click.group()
def identity() -> None:
    """The executor identity marker (which executor owns this database)."""


@identity.command("show")
@db_option
@json_option
@pass_settings
def show_identity(settings: Settings, as_json: bool) -> None:
    """Show the persisted executor identity, if any."""
    with projection_at_head(settings.target, read_only=True) as projection:
        persisted = projection.identity()
    if as_json:
        echo_json({"identity": identity_json(persisted)})
    else:
        click.echo(identity_text(persisted))


@identity.command("verify")
@click.option("--executor", type=click.Choice(EXECUTOR_PLUGINS), required=True)
@click.option("--temporal-address", default="", metavar="ADDRESS", help="host:port")
@click.option("--temporal-namespace", default="", metavar="NAMESPACE")
@db_option
@json_option
@pass_settings
def verify_identity(
    settings: Settings,
    executor: str,
    temporal_address: str,
    temporal_namespace: str,
    as_json: bool,
) -> None:
    """Exit 1 unless this executor configuration may use the database. Never writes.

    Without a marker, goworkflows passes (relay-flow adopts the database on
    start) and temporal fails (it needs the marker `init --executor temporal`
    writes).
    """
    configured = ExecutorIdentity(executor, temporal_address, temporal_namespace)
    validate_identity(configured)
    with projection_at_head(settings.target, read_only=True) as projection:
        persisted = projection.identity()
    problem: IdentityMismatch | IdentityMissing | None = None
    if persisted is None and executor != "goworkflows":
        problem = IdentityMissing(
            "the database has no executor identity marker; a temporal installation needs "
            "one: run `relay-flow-projection init --executor temporal ...`"
        )
    elif persisted is not None:
        try:
            require_same_identity(configured, persisted)  # the library's own wording
        except IdentityMismatch as exc:
            problem = exc
    if as_json:
        echo_json(
            {
                "ok": problem is None,
                "configured": identity_json(configured),
                "persisted": identity_json(persisted),
            }
        )
    if problem is not None:
        raise problem
    if not as_json:
        if persisted is None:
            click.echo("ok: no identity marker; goworkflows adopts this database on start")
        else:
            click.echo(f"ok: {identity_text(persisted)}")
