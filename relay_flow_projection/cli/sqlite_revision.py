"""``current`` on a plain SQLite file without SQLAlchemy or Alembic (start-up time).

Importing SQLAlchemy and Alembic costs more than the 0.3 s start-up budget of
``current`` by itself, and for the everyday case (a healthy SQLite file whose
version table holds one revision of this release's chain) neither is needed:
the standard library's sqlite3 reads the row and the chain's ids are read from
the revision files' ``revision``/``down_revision`` assignments (with ``ast``:
nothing is executed).

The answer is given only when it is certain; everything else (PostgreSQL, URLs
with options, missing or damaged files, read-only directories, locks, no or
several version rows, revisions this release does not know) returns None and
the caller takes the full path (access.read_revision), which owns every error
message. So this module never reports an error of its own.
"""

from __future__ import annotations

import ast
import os
import sqlite3
from functools import cache
from pathlib import Path

SQLITE_MAGIC = b"SQLite format 3\x00"  # as engine.SQLITE_MAGIC
_VERSIONS = Path(__file__).resolve().parent.parent / "migrations" / "versions"


def sqlite_path(target: str) -> Path | None:
    """The file a plain target names (a path, or ``sqlite:///path`` without options)."""
    if "://" not in target:
        return Path(target) if target else None
    prefix = "sqlite:///"
    if not target.startswith(prefix):
        return None
    database = target[len(prefix) :]
    # Escapes, options and URI file names are left to SQLAlchemy's parser.
    if not database or any(mark in database for mark in "%?#") or database.startswith("file:"):
        return None
    return Path(database)


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


@cache
def chain() -> tuple[frozenset[str], str] | None:
    """(every revision id of the packaged chain, its single head), or None if unsure."""
    revisions: set[str] = set()
    parents: set[str] = set()
    try:
        for script in sorted(_VERSIONS.glob("*.py")):
            tree = ast.parse(script.read_text(encoding="utf-8"), str(script))
            revision = _assigned(tree, "revision")
            down = _assigned(tree, "down_revision")
            if not isinstance(revision, str):
                return None
            revisions.add(revision)
            if isinstance(down, str):
                parents.add(down)
            elif isinstance(down, tuple | list):
                parents.update(str(parent) for parent in down)
            elif down is not None:
                return None
    except (OSError, SyntaxError, ValueError, LookupError, TypeError):
        return None
    heads = revisions - parents
    if len(heads) != 1:
        return None
    return frozenset(revisions), heads.pop()


def _plainly_healthy(path: Path) -> bool:
    """A regular SQLite file whose header agrees with its size (engine.check_sqlite_file
    judges and words every other case)."""
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return False
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    if page_size < 512 or size % page_size:
        return False
    return Path(f"{path}-wal").exists() or size >= page_count * page_size


def _version_rows(path: Path) -> list[str] | None:
    """The version table's rows, read-only, without waiting for any lock."""
    uri = f"file:{path.resolve()}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=0)
    except sqlite3.Error:
        return None
    try:
        rows = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None  # no version table, locked, damaged: the full path says which
    finally:
        connection.close()
    return [str(row[0]) for row in rows]


def quick_revision(target: str) -> tuple[str, str, str] | None:
    """(database as the operator sees it, its revision, head) when certain, else None."""
    path = sqlite_path(target)
    if path is None or not path.is_file() or not os.access(path.parent, os.W_OK):
        return None  # a read-only directory needs the immutable URI (migration_env)
    known = chain()
    if known is None or not _plainly_healthy(path):
        return None
    rows = _version_rows(path)
    if rows is None or len(rows) != 1 or rows[0] not in known[0]:
        return None
    return str(path), rows[0], known[1]
