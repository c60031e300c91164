"""The migration chain as data, without importing Alembic (start-up time).

Importing Alembic costs more than everything else an ``open_projection`` of a
database at head needs. What that needs is only "is the version row this
release's head?": one query of ``alembic_version`` compared with
:data:`HEAD_REVISION`. Alembic is loaded (``migrate``) only when a revision is
run, or when the answer is anything but "at head" (the full path words those
errors: a newer release's revision, another chain sharing the table, none).

The chain's ids, parents and messages are read from the revision files'
``revision`` / ``down_revision`` assignments and docstrings with ``ast``:
nothing is executed. tests/test_startup.py holds :data:`HEAD_REVISION`, and
:func:`chain_scripts`, equal to what Alembic's ScriptDirectory says.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

# The head of the packaged chain; a new revision updates it (a test fails until it does).
HEAD_REVISION = "0005_scale_indexes"
VERSION_TABLE = "alembic_version"
VERSIONS_DIRECTORY = Path(__file__).resolve().parent / "migrations" / "versions"


@dataclass(frozen=True, slots=True)
class ChainScript:
    """One revision file: what ``history`` shows of it."""

    revision: str
    down_revision: str | tuple[str, ...] | None
    doc: str


def _assigned(tree: ast.Module, name: str) -> object:
    """The literal assigned to *name* at module level (``x = ...`` or ``x: T = ...``)."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(value)
    raise LookupError(name)


def _doc(tree: ast.Module) -> str:
    """Alembic's ``Script.doc``: the module docstring, stripped, up to its first blank line."""
    text = ast.get_docstring(tree, clean=False)
    return "" if not text else text.strip().split("\n\n")[0]


@cache
def chain_scripts() -> tuple[ChainScript, ...] | None:
    """The packaged chain, newest first (as Alembic's ``walk_revisions``), or None when
    the files do not make one straight line of literals (then ask Alembic)."""
    scripts: dict[str, ChainScript] = {}
    try:
        for path in sorted(VERSIONS_DIRECTORY.glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            revision = _assigned(tree, "revision")
            down = _assigned(tree, "down_revision")
            if not isinstance(revision, str) or revision in scripts:
                return None
            if isinstance(down, list | tuple):
                down = tuple(str(parent) for parent in down)
            elif down is not None and not isinstance(down, str):
                return None
            scripts[revision] = ChainScript(revision, down, _doc(tree))
    except (OSError, SyntaxError, ValueError, LookupError, TypeError):
        return None
    ordered: list[ChainScript] = []
    current: str | None = HEAD_REVISION
    while current is not None:
        script = scripts.get(current)
        if script is None or isinstance(script.down_revision, tuple):
            return None  # a merge, or a parent that is not here: Alembic knows better
        ordered.append(script)
        current = script.down_revision
    if len(ordered) != len(scripts):
        return None  # a second head (HEAD_REVISION is stale) or a stray file
    return tuple(ordered)


def chain() -> tuple[frozenset[str], str] | None:
    """(every revision id of the packaged chain, its single head), or None if unsure."""
    scripts = chain_scripts()
    if scripts is None:
        return None
    return frozenset(script.revision for script in scripts), HEAD_REVISION


def version_rows(connection: Connection) -> list[str] | None:
    """The version table's rows in one query, or None when it cannot be read (no table,
    no privilege: the caller asks Alembic, which words those cases); leaves no
    transaction open."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    query = text("SELECT version_num FROM alembic_version")  # VERSION_TABLE
    try:
        return [str(value) for value in connection.execute(query).scalars()]
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise  # the database went away: that is the answer
        return None
    finally:
        connection.rollback()


def at_head(connection: Connection) -> bool:
    """True when the projection's version row is HEAD_REVISION (one query, no Alembic).

    Other rows in the table belong to another chain sharing it (README "Deploying").
    False means "not certain": the caller takes Alembic's path.
    """
    rows = version_rows(connection)
    return rows is not None and HEAD_REVISION in rows
