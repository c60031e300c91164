"""Schema commands: ``upgrade``, ``downgrade``, ``current``, ``history``, ``check``.

Importing this module loads neither SQLAlchemy nor Alembic (``current`` on a
SQLite file answers without them: start-up time); the commands import what
they need when they run.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import click

from .access import (
    Revision,
    legacy_shape,
    out_of_date,
    read_revision,
    read_revision_quickly,
    schema_drift,
)
from .errors import BadInput, CliError, Drift, translate
from .jsonview import echo_json
from .options import Settings, db_option, json_option, pass_settings

if TYPE_CHECKING:
    from collections.abc import Sequence

    from alembic.script import Script, ScriptDirectory

    from ..revisions import ChainScript


def revision_text(revision: Revision) -> str:
    if revision.current is None:
        return f"no revision (not initialized; head is {revision.head})"
    if revision.at_head:
        return f"{revision.current} (head)"
    return f"{revision.current} (not at head {revision.head})"


def _script() -> ScriptDirectory:
    from .. import migrate

    return migrate.script_directory()


def _resolve_revision(script: ScriptDirectory, revision: str) -> str | None:
    """The revision id REVISION names (None for ``base``); relative steps are left to Alembic."""
    from alembic.util import CommandError

    if revision == "base":
        return None
    try:
        found = script.get_revisions(revision)
    except CommandError as exc:
        raise click.BadParameter(str(exc), param_hint="REVISION") from None
    if len(found) != 1 or found[0] is None:
        raise click.BadParameter(f"{revision!r} names no single revision", param_hint="REVISION")
    return found[0].revision


def _ancestry(script: ScriptDirectory, revision: str | None) -> list[str]:
    """*revision* and every revision below it, newest first (empty for none/base)."""
    if revision is None:
        return []
    return [r.revision for r in script.iterate_revisions(revision, "base")]


def _relative(revision: str) -> bool:
    return re.search(r"[+-]\d", revision) is not None  # "+1", "-2", "head-1": Alembic resolves


@click.command()
@click.argument("revision", default="head")
@db_option
@pass_settings
def upgrade(settings: Settings, revision: str) -> None:
    """Upgrade the database to REVISION (default: head), creating it if needed.

    Already at head, `upgrade` (to head) succeeds and changes nothing; an
    explicit REVISION at or below the current one exits 1 (use `downgrade`).
    """
    from ..database import upgrade as upgrade_database

    script = _script()
    wanted = None if _relative(revision) else _resolve_revision(script, revision)
    before = read_revision(settings.target, missing_ok=True)
    if revision == "base":
        raise CliError(
            f"{before.database} is at {revision_text(before)}; `upgrade` never goes back: "
            "use `relay-flow-projection downgrade base`"
        )
    if wanted is not None and wanted in _ancestry(script, before.current):
        if revision in {"head", "heads"}:
            click.echo(f"{before.database} is already at {revision_text(before)}")
            return
        if wanted == before.current:
            raise CliError(f"{before.database} is already at {revision_text(before)}")
        raise CliError(
            f"{before.database} is at {revision_text(before)}, past {wanted}; "
            f"`upgrade` never goes back: use `relay-flow-projection downgrade {wanted}`"
        )
    upgrade_database(settings.target, revision)
    after = read_revision(settings.target)
    click.echo(
        f"upgraded {after.database} from {before.current or '(none)'} to {revision_text(after)}"
    )


_STEPS_DOWN = re.compile(r"(?P<base>.*?)-(?P<steps>\d+)")


def _downgrade_target(script: ScriptDirectory, before: Revision, revision: str) -> str | None:
    """The revision id a downgrade to REVISION ends at (None for base).

    Relative steps down (``-1``, ``head-2``, ``0005-1``) are resolved here, not
    by Alembic, so that the revisions a downgrade undoes are known before it runs.
    """
    relative = _STEPS_DOWN.fullmatch(revision)
    if relative is None:
        if "+" in revision:
            raise click.BadParameter(
                f"{revision!r} is a step up; `downgrade` only goes back "
                "(use `relay-flow-projection upgrade`)",
                param_hint="REVISION",
            )
        return _resolve_revision(script, revision)
    base = relative["base"]
    origin = before.current if base in {"", "current"} else _resolve_revision(script, base)
    below = _ancestry(script, origin)
    steps = int(relative["steps"])
    if steps > len(below):
        raise click.BadParameter(
            f"{revision!r} goes {steps} revision{'' if steps == 1 else 's'} back from "
            f"{origin}, but only {len(below)} {'is' if len(below) == 1 else 'are'} applied",
            param_hint="REVISION",
        )
    return below[steps] if steps < len(below) else None


def keeps_data(script: ScriptDirectory, revision: str) -> bool:
    """Whether undoing *revision* keeps every row: its module's ``downgrade_keeps_data``
    (every revision declares it; tests/test_cli.py holds them to it). Undeclared: no."""
    found = script.get_revision(revision)
    return found is not None and getattr(found.module, "downgrade_keeps_data", False) is True


def _confirm_data_loss(database: str, deleting: list[str], yes: bool) -> None:
    """A downgrade that deletes data runs only with --yes, or when confirmed on a terminal."""
    import sys

    if yes or not deleting:
        return
    what = (
        f"downgrading {database} undoes {', '.join(deleting)}, which "
        f"drop{'s' if len(deleting) == 1 else ''} tables or columns and the data in them"
    )
    if sys.stdin.isatty():
        if click.confirm(f"{what}. Back up the database first. Continue?", default=False):
            return
        raise BadInput(f"{what}; not confirmed, nothing changed")
    raise BadInput(f"{what}; back up the database, then run again with --yes")


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("revision")
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask before a downgrade that deletes data (tables, columns).",
)
@db_option
@pass_settings
def downgrade(settings: Settings, revision: str, yes: bool) -> None:
    """Downgrade the database to REVISION (a revision id, `base`, or `-1`).

    Undoes the revisions above REVISION, dropping what they added: back up
    the database first. One that deletes data (tables, columns) runs only with
    --yes, or when confirmed on a terminal. A REVISION at or above the
    current one exits 1.
    """
    from .. import migrate

    if revision.startswith("--"):  # an unknown option, let through for `-1`
        raise click.NoSuchOption(revision)
    script = _script()
    before = read_revision(settings.target)
    if before.current is None:
        raise CliError(f"{before.database} has no revision to downgrade from")
    wanted = _downgrade_target(script, before, revision)
    current_and_below = _ancestry(script, before.current)
    if wanted == before.current:
        raise CliError(f"{before.database} is already at {revision_text(before)}")
    if wanted is not None and wanted not in current_and_below[1:]:
        raise CliError(
            f"{before.database} is at {revision_text(before)}, below {wanted}; "
            f"`downgrade` only goes back: use `relay-flow-projection upgrade {wanted}`"
        )
    kept = set(_ancestry(script, wanted))
    undone = [r for r in current_and_below if r not in kept]
    _confirm_data_loss(before.database, [r for r in undone if not keeps_data(script, r)], yes)
    try:
        migrate.run_downgrade(settings.target, wanted or "base")
    except Exception as exc:
        error = translate(exc, f"downgrading {before.database} to {revision}")
        if error is exc:
            raise
        raise error from exc
    after = read_revision(settings.target)
    click.echo(f"downgraded {after.database} from {before.current} to {revision_text(after)}")


@click.command()
@json_option
def history(as_json: bool) -> None:
    """The migration chain of this release, newest first. Reads no database."""
    from ..revisions import HEAD_REVISION, chain_scripts

    # Read from the revision files without Alembic (start-up time); Alembic if unsure.
    head: str | None = HEAD_REVISION
    revisions: Sequence[ChainScript | Script] | None = chain_scripts()
    if revisions is None:
        script = _script()
        head = script.get_current_head()
        revisions = list(script.walk_revisions())
    if as_json:
        echo_json(
            [
                {
                    "revision": r.revision,
                    "down_revision": r.down_revision,
                    "head": r.revision == head,
                    "message": r.doc,
                }
                for r in revisions
            ]
        )
        return
    for r in revisions:
        mark = " (head)" if r.revision == head else ""
        click.echo(f"{r.down_revision or '<base>'} -> {r.revision}{mark}: {r.doc}")


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
    """Show the database's revision and whether it is the head. Reads only."""
    revision = read_revision_quickly(settings.target)
    # Unversioned: what `upgrade` would make of it (unknown relay tables: exit 2, as there).
    shape = legacy_shape(settings.target) if revision.current is None else None
    if as_json:
        echo_json(revision_json(revision))
    elif shape is not None:
        click.echo(
            f"{revision.database}: no revision (an unversioned database of an older "
            f"relay-flow release, shaped like {shape}; `upgrade` adopts it)"
        )
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
    """Exit 0 only if the database is at head (else 4) and matches the models (else 5)."""
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
        raise Drift(
            f"{revision.database} drifts from the models ({len(drift)} difference"
            f"{'' if len(drift) == 1 else 's'})"
        )
    if not as_json:
        click.echo(f"{revision.database}: at head {revision.head}, no drift")
