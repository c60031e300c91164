"""The exceptions of the public contract (API.md).

Driver exceptions are translated into these at the repository boundary; callers
never need to import anything from SQLAlchemy or a DB-API driver to handle them.
"""

from __future__ import annotations


class ProjectionError(Exception):
    """Base of every error this package raises on purpose."""


class RunNotFound(ProjectionError, LookupError):
    """The run named by the call does not exist."""


class NodeRuntimeNotFound(ProjectionError, LookupError):
    """The run has no runtime binding for the node."""


class NodeVisitNotCurrent(ProjectionError):
    """The visit given is not the node's current visit."""


class InvalidIdentity(ProjectionError, ValueError):
    """An executor identity that can never be valid."""


class IdentityMissing(ProjectionError):
    """The database carries no executor identity marker and one is required."""


class IdentityMismatch(ProjectionError):
    """The configured executor identity differs from the persisted marker."""


class NotAProjectionDatabase(ProjectionError):
    """The target exists but is not a SQLite database / not a relay projection."""


class ExtraNotInstalled(ProjectionError, ImportError):
    """What a call needs comes with an optional extra that is not installed.

    The message is one line naming the ``pip install "relay-flow-projection[...]"``
    that provides it (the asyncio facade's greenlet and aiosqlite, a database driver).
    """


class SchemaOutOfDate(ProjectionError):
    """The schema is not at the head revision this code knows."""


class DatabaseUnavailable(ProjectionError):
    """The database could not be reached, or dropped the connection during the call.

    Retryable: every write is an idempotent durable activity, so calling again
    once the database is back is safe.
    """


class DatabaseBusy(ProjectionError):
    """A lock held by someone else was not released within ``lock_timeout``.

    Retryable, like ``DatabaseUnavailable``.
    """
