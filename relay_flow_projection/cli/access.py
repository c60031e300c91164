"""Opening the database for a command: revision look-ups and the projection at head.

Reading commands (status, current, check, runs, identity show/verify) open
SQLite read-only: they work on a read-only file or in a read-only directory
and never create or change anything. Heavy modules (SQLAlchemy, Alembic, the
repository) are imported inside the functions that need them, so ``--help``
and argument errors stay fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ProjectionError, SchemaOutOfDate
from .errors import BadInput, NotFound, translate

if TYPE_CHECKING:
    from ..engine import ResolvedTarget
    from ..repository import RunProjection

UPGRADE_HINT = "run `relay-flow-projection upgrade`"


@dataclass(frozen=True, slots=True)
class Revision:
    """Where a database stands against the migration chain of this release."""

    database: str
    current: str | None
    head: str

    @property
    def at_head(self) -> bool:
        return self.current == self.head


def _require_file(resolved: ResolvedTarget) -> None:
    if resolved.path is not None and not resolved.path.exists():
        raise NotFound(
            f"{resolved.path} does not exist; create it with `relay-flow-projection init`"
        )


def resolve(target: str) -> ResolvedTarget:
    """The target, or a usage error (exit code 2) saying which part of the URL is wrong."""
    from ..engine import check_url, resolve_target

    try:
        return check_url(resolve_target(target))
    except ProjectionError as exc:
        raise BadInput(str(exc)) from None


def read_revision(target: str, *, missing_ok: bool = False) -> Revision:
    """The database's revision, read without writing anything (None when unversioned).

    *missing_ok*: an absent SQLite file reads as unversioned instead of failing.
    A revision this release does not know (a newer release wrote it) raises
    SchemaOutOfDate telling the operator to upgrade the package.
    """
    from sqlalchemy.pool import NullPool

    from ..engine import build_engine, readable_target
    from ..revisions import HEAD_REVISION, at_head

    resolved = resolve(target)
    head = HEAD_REVISION
    if missing_ok and resolved.path is not None and not resolved.path.exists():
        return Revision(resolved.describe(), None, head)
    _require_file(resolved)
    try:
        engine = build_engine(readable_target(resolved), read_only=True, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                # One query, no Alembic, in the everyday case (start-up time).
                if at_head(connection):
                    return Revision(resolved.describe(), head, head)
                from .. import migrate

                current = migrate.current_revision(connection)
        finally:
            engine.dispose()
    except Exception as exc:
        error = translate(exc, f"reading {resolved.describe()}")
        if error is exc:
            raise
        raise error from exc
    if current is not None and current != head:
        from .. import migrate
        from ..migration_env import newer_release_error

        newer = newer_release_error([current], migrate.script_directory(), resolved.describe())
        if newer is not None:
            raise newer
    return Revision(resolved.describe(), current, head)


def read_revision_quickly(target: str) -> Revision:
    """read_revision, answered without SQLAlchemy or Alembic when a plain SQLite file
    or PostgreSQL URL allows it (quick_revision: ``current`` starts in well under 0.3 s)."""
    from .quick_revision import quick_revision

    found = quick_revision(target)
    return read_revision(target) if found is None else Revision(*found)


def legacy_shape(target: str) -> str | None:
    """What an unversioned database is, as ``upgrade`` judges it (legacy.py): the
    revision of the relay-flow Go release whose shape it has (``upgrade`` adopts it),
    None when it holds no relay tables (``upgrade`` creates them). Relay tables of
    no known shape raise NotAProjectionDatabase (bad input), as ``upgrade`` does."""
    from sqlalchemy.pool import NullPool

    from ..engine import build_engine, readable_target
    from ..errors import NotAProjectionDatabase
    from ..legacy import detect_legacy_generation

    resolved = resolve(target)
    try:
        engine = build_engine(readable_target(resolved), read_only=True, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                return detect_legacy_generation(connection)
        finally:
            engine.dispose()
    except NotAProjectionDatabase as exc:
        raise NotAProjectionDatabase(
            f"{resolved.describe()} is not a relay projection (an unknown shape; "
            f"`upgrade` refuses it): {exc}"
        ) from None
    except Exception as exc:
        error = translate(exc, f"reading {resolved.describe()}")
        if error is exc:
            raise
        raise error from exc


def out_of_date(revision: Revision) -> SchemaOutOfDate:
    return SchemaOutOfDate(
        f"{revision.database} is at revision {revision.current or '(none)'}, "
        f"not at head {revision.head}; {UPGRADE_HINT}"
    )


def require_head(target: str) -> Revision:
    revision = read_revision(target)
    if not revision.at_head:
        raise out_of_date(revision)
    return revision


@contextmanager
def projection_at_head(
    target: str, *, read_only: bool = False, revision: Revision | None = None
) -> Iterator[RunProjection]:
    """A RunProjection on a database at head; its engine is disposed afterwards.

    *read_only*: open the database read-only (SQLite ``mode=ro``, or
    ``immutable`` in a directory nobody can write; see migration_env.readable_target).
    *revision*: what require_head already returned for *target* (not read again).
    """
    from sqlalchemy.pool import NullPool

    from ..database import open_projection
    from ..engine import readable_target

    if revision is None:
        require_head(target)
    opened = target
    if read_only:
        opened = readable_target(resolve(target)).url.render_as_string(hide_password=False)
    projection = open_projection(opened, poolclass=NullPool, read_only=read_only)
    try:
        yield projection
    finally:
        projection.close()


def schema_drift(target: str) -> list[tuple[object, ...] | list[tuple[object, ...]]]:
    """Alembic's autogenerate comparison, exactly as ``alembic check`` runs it in CI."""
    import io

    from alembic import command
    from alembic.util import AutogenerateDiffsDetected

    from .. import migrate

    config = migrate.alembic_config(target)
    config.stdout = io.StringIO()  # "No new upgrade operations detected." is ours to say
    try:
        command.check(config)
    except AutogenerateDiffsDetected as exc:
        return list(exc.diffs)
    return []
