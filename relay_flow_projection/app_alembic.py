"""Hooks for an application's own Alembic environment that runs our chain beside its own.

An application that keeps its tables in the same database lists our chain in
its ``version_locations`` (README, "An application with its own Alembic
environment") and passes two hooks to ``context.configure`` in its env.py::

    from relay_flow_projection import app_alembic

    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_name=app_alembic.include_name,
        process_revision_directives=app_alembic.process_revision_directives,
    )

- :func:`include_name` leaves our ``relay_*`` tables out of the application's
  autogenerate (our revisions create them; its models do not hold them).
- :func:`process_revision_directives` refuses a new revision that would join
  our chain -- whose parent is one of our revisions, or that would be written
  into our versions directory, inside the installed package -- and says which
  command starts the application's own branch instead. Nothing is written.

Importing this module loads nothing of the projection but its migration
scripts' location.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError

if TYPE_CHECKING:
    from alembic.operations.ops import MigrationScript
    from alembic.runtime.migration import MigrationContext

RELAY_TABLE_PREFIX = "relay_"
# The branch label and the directory README's recipe gives the application.
DEFAULT_BRANCH_LABEL = "app"
DEFAULT_VERSION_PATH = "migrations/versions"

IncludeName = Callable[[str | None, str, Any], bool]


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic's ``include_name`` hook: every object but relay_flow_projection's tables."""
    if type_ == "table":
        return not (name or "").startswith(RELAY_TABLE_PREFIX)
    return True


def without_relay_tables(own: IncludeName) -> IncludeName:
    """The application's own ``include_name`` hook, with our tables left out as well."""

    def hook(name: str | None, type_: str, parent_names: Any) -> bool:
        return include_name(name, type_, parent_names) and own(name, type_, parent_names)

    return hook


def chain_versions_directory() -> Path:
    """Where our revisions live: the installed package's ``migrations/versions``."""
    return Path(__file__).resolve().parent / "migrations" / "versions"


def _is_ours(path: str | os.PathLike[str] | None) -> bool:
    if path is None:
        return False
    try:
        return Path(path).resolve() == chain_versions_directory()
    except OSError:
        return False


def process_revision_directives(
    context: MigrationContext,
    revision: Any,
    directives: Sequence[MigrationScript],
) -> None:
    """Alembic's ``process_revision_directives`` hook: refuse a revision on our chain.

    Refused (a CommandError: ``FAILED: ...``, exit non-zero, no file written):
    a revision whose parent (``--head``, by default the single head) is one of
    relay_flow_projection's revisions, or whose directory (``--version-path``,
    by default its parent's) is our versions directory. Anything else --
    among it an autogenerate that finds no change, which writes an empty
    revision -- is left exactly as Alembic made it.
    """
    script = context.script
    for directive in directives:
        problem = _problem(script, directive)
        if problem is not None:
            raise CommandError(_refusal(context, script, directive, problem))


def _problem(script: ScriptDirectory | None, directive: MigrationScript) -> str | None:
    """Why *directive* would join our chain (None: it does not)."""
    if directive.version_path is not None and _is_ours(directive.version_path):
        return (
            f"--version-path {directive.version_path} is relay_flow_projection's versions "
            "directory, inside the installed package"
        )
    if script is None:
        return None
    try:
        # No --head: Alembic builds on "head", the single head (else it refuses).
        parents = script.revision_map.get_revisions(directive.head or "head")
    except (RevisionError, CommandError):
        return None  # Alembic refuses it itself, in its own words
    for parent in parents:
        if parent is None or isinstance(parent, str):
            continue  # base
        path = getattr(parent, "path", None)
        if path is not None and _is_ours(Path(path).parent):
            where = "" if directive.version_path is not None else ", in the installed package"

            return (
                f"its parent would be {parent.revision}, a revision of relay_flow_projection's "
                f"chain{where}"
            )
    return None


def _refusal(
    context: MigrationContext,
    script: ScriptDirectory | None,
    directive: MigrationScript,
    problem: str,
) -> str:
    options = getattr(getattr(context, "environment_context", None), "config", None)
    command_options = getattr(options, "cmd_opts", None)
    words = ["alembic", "revision"]
    if getattr(command_options, "autogenerate", True):
        words.append("--autogenerate")
    words += ["--head", "base", "--branch-label", DEFAULT_BRANCH_LABEL]
    words += ["--version-path", _application_versions(script)]
    words += ["-m", directive.message or "..."]
    command = " ".join(shlex.quote(word) for word in words)
    return (
        f"relay_flow_projection: not writing this revision: {problem}. An application's "
        "revisions form a branch of their own, in its own directory; start it with "
        f"`{command}` (later revisions: --head {DEFAULT_BRANCH_LABEL}@head)"
    )


def _application_versions(script: ScriptDirectory | None) -> str:
    """The application's own version location, as a path relative to here if it can be."""
    locations: Sequence[Path] = () if script is None else script._version_locations
    for location in locations:
        if _is_ours(location):
            continue
        try:
            return os.path.relpath(location)
        except ValueError:  # another drive (Windows)
            return str(location)
    return DEFAULT_VERSION_PATH
