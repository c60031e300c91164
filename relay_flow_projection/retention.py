"""Retention: sweeping old terminal runs in time-sized, set-based batches, with an archive.

``Sweep`` is one ``sweep_retention`` call. Each ``run_batch`` runs inside one
write transaction that the facade's executor opened (execution.py): it picks
the next batch (``SELECT ... FOR UPDATE`` on PostgreSQL, under the write lock
``BEGIN IMMEDIATE`` took on SQLite), writes it to the archive if there is one,
then deletes it. The facade calls ``batch_committed`` once the transaction has
committed.

Batch size follows measured time
--------------------------------
Each batch holds the write lock (SQLite) or its row locks (PostgreSQL) for
about ``target_batch_seconds`` at most (default 75 ms), and never deletes more
than ``batch_size`` runs. A batch is timed from its first statement to the end
of its commit: on SQLite the commit may run a WAL checkpoint, and the
in-process writer queue stays taken until it ends, so the checkpoint counts.
Batches are sized for 70% of the target (``AIM``): how long a batch of a
given size takes varies (the checkpoint falls on every other commit or so;
other processes want the CPU and the disk), and a writer queued behind a
batch waits for all of it. The next size is that aim divided by the cost per
run -- the mean of this batch's and the previous estimate, or this batch's
alone when it overran the aim -- and at most twice the size before. A fixed
cost per batch makes the cost per run fall as batches grow, so sizes settle
from below without oscillating. The first batch has 200 runs.

Statements
----------
One set-based ``DELETE`` per table, the ids bound as one value: a PostgreSQL
array (``= ANY(:ids)``), a JSON array read by SQLite's ``json_each`` (an
expanding ``IN`` of thousands of parameters costs more to build, bind and
prepare than the deletes themselves; dialect.py). PostgreSQL always cascades,
so the runs' ``DELETE`` alone removes their child rows (its per-row
foreign-key actions run whether or not the children are gone, so deleting
them first is extra work). SQLite deletes the children first, one statement
per table, then the runs: set-based deletes cost less than SQLite's per-row
cascade, and they keep the sweep complete on a connection without foreign
keys. Since the batch deletes every row that refers to its runs itself, its
transaction runs with ``foreign_keys`` off (``Operation.deletes_dependents``):
SQLite would otherwise search every child table again for each run deleted
(about 15% of the sweep's CPU time). Rows are found by key in every table (the
ids are sorted by the ``IN`` list's index and the array scan; sorting them in
Python changed nothing). Measurements: README, Performance.

The archive
-----------
With ``archive=``, every swept run is written as one line of JSON (UTF-8,
keys sorted, ``\\n``-terminated)::

    {"relay_node_runtime": [{...}], "relay_node_sessions": [{...}],
     "relay_processed_reports": [{...}], "run": {...}}

``run`` holds every column of ``relay_runs`` by name; each child list holds
that table's rows of the run, every column by name, ordered by primary key
(an empty list when there are none). Timestamps are ISO 8601 in UTC, as
``datetime.isoformat()`` writes them (``2025-01-01T00:00:30+00:00``, with
``.ffffff`` when there are microseconds); absent values are ``null``. The
keys are the tables' column names, so a schema revision that adds a column
adds a key.

The lines of a batch are written -- and for an archive path made durable
with ``fsync`` -- before the batch's ``DELETE`` statements run, so a batch
that commits is always archived first. A failure to write rolls the batch
back: nothing it chose is deleted. A sweep interrupted after writing a batch
but before its commit (a crash, a kill, a lost connection) leaves those runs
in the database and in the archive; the next sweep archives them again. **A
run may appear twice in an archive, never zero times**; readers should key
lines by ``run.id``.

A path is opened for appending (created ``0600``, like the database file)
and locked for the sweep (``flock``): a second sweep into the same file
fails at once. A name ending in ``.gz`` is gzip-compressed, each batch one
complete gzip member (concatenated members are one valid gzip file that
``gzip``/``zcat`` read whole). A kill can cut a batch's write short (Linux
stops a write between pages on SIGKILL), leaving part of a line or of a
gzip member at the end of the file -- a batch that was never deleted. The
next sweep into the file cuts that off before it appends, so the file reads
whole again; it refuses a file that ends in anything else. A file object
given by the caller is written to and flushed (never closed, never
repaired); its durability is the caller's.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import time
import zlib
from collections.abc import Iterator
from datetime import datetime
from functools import cache
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no advisory lock on the archive
    fcntl = None  # type: ignore[assignment]

from sqlalchemy import Delete, Select, and_, bindparam, delete, func, select
from sqlalchemy.engine import Connection

from . import validation as check
from .dialect import always_cascades, matches_any
from .engine import FILE_MODE
from .errors import ProjectionError
from .schema import RUN_CHILD_TABLES, is_terminal, runs
from .timestamps import UtcDateTime, require_aware

DEFAULT_TARGET_BATCH_SECONDS = 0.075
AIM = 0.7  # batches are sized for this fraction of the target (module docstring)
FIRST_BATCH = 200

_SWEEPABLE = and_(
    is_terminal,
    runs.c.finished_at.is_not(None),
    runs.c.finished_at < bindparam("older_than", type_=UtcDateTime()),
)
COUNT_SWEEPABLE = select(func.count()).select_from(runs).where(_SWEEPABLE)
# FOR UPDATE (PostgreSQL) keeps a concurrent writer from reviving a run between
# choosing it and deleting it; SQLite's BEGIN IMMEDIATE already excludes writers.
SELECT_SWEEPABLE = (
    select(runs.c.id)
    .where(_SWEEPABLE)
    .order_by(runs.c.finished_at)
    .limit(bindparam("batch_size"))
    .with_for_update()
)


@cache
def _delete_runs_statements(dialect: str) -> tuple[Delete, ...]:
    """The runs' DELETE, after one per child table where the cascade is not relied on.

    Keyed by dialect name (a str keeps no engine alive); see the module docstring.
    """
    parents = delete(runs).where(matches_any(dialect, runs.c.id, "ids"))
    if always_cascades(dialect):
        return (parents,)
    children = tuple(
        delete(table).where(matches_any(dialect, table.c.run_id, "ids"))
        for table in RUN_CHILD_TABLES
    )
    return (*children, parents)


@cache
def _count_present(dialect: str) -> Select[Any]:
    """How many of the runs bound as ``ids`` still exist (settling a lost COMMIT)."""
    return select(func.count()).select_from(runs).where(matches_any(dialect, runs.c.id, "ids"))


@cache
def _archive_selects(dialect: str) -> tuple[tuple[str, Select[Any], tuple[int, ...]], ...]:
    """Per table, runs first: its name, its rows of the ids bound as ``ids`` in key
    order, and the positions of its timestamp columns."""
    return tuple(
        (
            table.name,
            select(table).where(matches_any(dialect, column, "ids")).order_by(*table.primary_key),
            tuple(i for i, c in enumerate(table.columns) if isinstance(c.type, UtcDateTime)),
        )
        for table, column in (
            (runs, runs.c.id),
            *((child, child.c.run_id) for child in RUN_CHILD_TABLES),
        )
    )


def _records(result: Any, stamps: tuple[int, ...]) -> Iterator[dict[str, Any]]:
    """The rows of *result* as JSON-ready dicts (timestamps as ISO 8601 text)."""
    keys = list(result.keys())
    for row in result.all():
        values = list(row)
        for position in stamps:
            if values[position] is not None:
                values[position] = values[position].isoformat()
        yield dict(zip(keys, values, strict=True))


# How every batch's gzip member starts (gzip.compress: no file name, XFL 0 at
# level 6, OS "unknown"), around the four bytes of its time; and every line.
_MEMBER_HEAD = b"\x1f\x8b\x08\x00"
_MEMBER_HEAD_END = b"\x00\xff"
_LINE_HEAD = b'{"relay_node_runtime": ['
_TAIL_WINDOW = 8 << 20


def _lines_end(descriptor: int, size: int) -> int:
    """Where the last whole line ends (0: there is none)."""
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        newline = os.pread(descriptor, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _members_end(descriptor: int, size: int) -> int:
    """Where the last whole gzip member ends (0: there is none).

    Fast path: a member that starts in the last 8 MiB decompresses exactly to
    the end of the file. Otherwise (after an interruption) every member is
    read from the start.
    """
    start = max(0, size - _TAIL_WINDOW)
    tail = os.pread(descriptor, size - start, start)
    found = tail.rfind(_MEMBER_HEAD)
    while found >= 0:
        reader = zlib.decompressobj(wbits=31)
        try:
            reader.decompress(tail[found:])
            if reader.eof and not reader.unused_data:
                return size
        except zlib.error:
            pass
        found = tail.rfind(_MEMBER_HEAD, 0, found)
    end = offset = 0
    reader = zlib.decompressobj(wbits=31)
    while offset < size:
        chunk = os.pread(descriptor, min(1 << 20, size - offset), offset)
        while chunk:
            try:
                reader.decompress(chunk)
            except zlib.error:
                return end
            if not reader.eof:
                offset += len(chunk)
                break
            offset += len(chunk) - len(reader.unused_data)
            end = offset
            chunk = reader.unused_data
            reader = zlib.decompressobj(wbits=31)
    return end


def _drop_torn_batch(descriptor: int, path: str, compressed: bool) -> None:
    """Cut off what a batch killed while its lines were being written left behind.

    A batch's lines are written before anything of it is deleted, and a kill
    can cut that write short (Linux stops a write to a file between pages on
    SIGKILL): the file then ends in part of a line or a gzip member of a batch
    that was never deleted -- its runs are still in the database, and the next
    sweep archives them again. It is cut off here so that the file reads
    whole again. Anything else at the end of the file is not ours to cut:
    that is an error.
    """
    size = os.fstat(descriptor).st_size
    end = _members_end(descriptor, size) if compressed else _lines_end(descriptor, size)
    if end == size:
        return
    torn = os.pread(descriptor, min(size - end, len(_LINE_HEAD)), end)
    if compressed:  # the head of a member as gzip.compress writes it, its time aside
        ours = _MEMBER_HEAD.startswith(torn[:4]) and _MEMBER_HEAD_END.startswith(torn[8:10])
    else:
        ours = _LINE_HEAD.startswith(torn)
    if not ours:
        raise ProjectionError(
            f"the sweep archive {path} ends in {size - end} bytes that are not a whole "
            f"{'gzip member' if compressed else 'line'} written by a sweep; "
            f"cut them off (truncate -s {end} {path}) or use another file"
        )
    os.ftruncate(descriptor, end)


def _make_private(descriptor: int, path: str) -> None:
    """Tighten an existing archive to 0600 before appending run data to it: an
    archive made 0644 (by hand, or by a release that left the mode alone) would
    otherwise keep the swept rows readable by everyone."""
    if os.fstat(descriptor).st_mode & 0o777 == FILE_MODE:
        return
    try:
        os.fchmod(descriptor, FILE_MODE)
    except PermissionError as exc:
        raise ProjectionError(
            f"the sweep archive {path} is readable by others and cannot be made private "
            f"(0600: {exc.strerror}); chmod 600 it, or archive to a new file"
        ) from None


class _Archive:
    """Where archived lines go: a path this sweep opened, or the caller's binary file."""

    def __init__(self, target: str | os.PathLike[str] | BinaryIO) -> None:
        self._owned: Any = None  # an unbuffered file this sweep opened (and closes)
        self._given: Any = None
        if isinstance(target, str | os.PathLike):
            path = os.fspath(target)
            self.compress = path.endswith(".gz")
            self._owned = self._open(path)
        elif hasattr(target, "write"):
            self._given = target
            self.compress = False
        else:
            raise TypeError(
                f"archive must be a path or a writable binary file, not {type(target).__name__}"
            )

    def _open(self, path: str) -> Any:
        """The archive file, opened for appending by this sweep alone, its tail whole."""
        try:
            # Created 0600 like the database file (it holds the same rows).
            descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
        except UnicodeEncodeError:
            raise ValueError(f"archive path {path!r} cannot be encoded as a file name") from None
        except OSError as exc:
            raise ProjectionError(
                f"cannot open the sweep archive {path}: {exc.strerror or exc}"
            ) from exc
        try:
            _make_private(descriptor, path)
            if fcntl is not None:  # an advisory lock, gone with the process that held it
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise ProjectionError(f"another sweep is writing the archive {path}") from None
            _drop_torn_batch(descriptor, path, self.compress)
            return os.fdopen(descriptor, "ab", buffering=0)
        except OSError as exc:
            os.close(descriptor)
            raise ProjectionError(
                f"cannot prepare the sweep archive {path}: {exc.strerror or exc}"
            ) from exc
        except BaseException:
            os.close(descriptor)
            raise

    def write(self, data: bytes) -> None:
        """*data* in the file -- and on disk, for a path -- before this returns."""
        if self.compress:
            # One whole gzip member per batch; level 6 (gzip's default) compresses
            # JSON lines almost as well as 9 in a sixth of the time, inside the lock.
            data = gzip.compress(data, compresslevel=6)
        file = self._owned if self._owned is not None else self._given
        rest: bytes | memoryview = data
        while rest:  # one write(2) for a path, unless the kernel takes less
            written = file.write(rest)
            if written == 0:
                raise OSError(errno.EIO, "the archive file takes no more bytes")
            # A raw file may take part of it (and says how much); buffered ones take all.
            rest = memoryview(rest)[written:] if isinstance(written, int) else b""
        if self._owned is not None:
            os.fsync(self._owned.fileno())
        else:
            file.flush()

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None


class Sweep:
    """One sweep_retention call (see the module docstring)."""

    def __init__(
        self,
        older_than: datetime,
        *,
        batch_size: int,
        target_batch_seconds: float = DEFAULT_TARGET_BATCH_SECONDS,
        archive: str | os.PathLike[str] | BinaryIO | None = None,
    ) -> None:
        self._cutoff = require_aware(older_than, "older_than")
        self._max = check.positive(batch_size, "batch_size")
        if isinstance(target_batch_seconds, bool) or not isinstance(
            target_batch_seconds, int | float
        ):
            raise TypeError("target_batch_seconds must be a number of seconds")
        if not (0 < target_batch_seconds < math.inf):
            raise ValueError(f"target_batch_seconds must be positive, got {target_batch_seconds}")
        self.target = float(target_batch_seconds)
        self.size = min(self._max, FIRST_BATCH)  # the next batch's size
        self._archive = None if archive is None else _Archive(archive)
        self._cost_per_run: float | None = None
        self._started = 0.0
        self._deleted = 0
        self._batch: list[str] = []
        self.done = False

    def run_batch(self, conn: Connection) -> list[str]:
        """The executor's operation body: choose, archive and delete one batch."""
        self._started = time.monotonic()
        dialect = conn.dialect.name
        params = {"older_than": self._cutoff, "batch_size": self.size}
        ids = list(conn.execute(SELECT_SWEEPABLE, params).scalars())
        if ids:
            if self._archive is not None:
                self._write_archive(conn, dialect, ids)
            for statement in _delete_runs_statements(dialect):
                conn.execute(statement, {"ids": ids})
        self._batch = ids
        self._deleted = len(ids)
        self.done = len(ids) < self.size
        return ids

    def settle_lost_commit(self, conn: Connection) -> list[str] | None:
        """The batch run_batch chose, if its COMMIT (lost with its connection) took effect.

        A batch commits whole or not at all: none of its runs left means it
        committed and these are the ids it deleted; any left means it did not,
        and None has the executor run the batch once more (the archive then
        holds its runs twice, which readers already allow).
        """
        if not self._batch:
            return self._batch
        present = _count_present(conn.dialect.name)
        left = conn.execute(present, {"ids": self._batch}).scalar_one()
        return None if left else self._batch

    def batch_committed(self) -> None:
        """The facade's call once run_batch's transaction has committed: size the next one."""
        elapsed = time.monotonic() - self._started
        if self._deleted:
            self.size = self.next_size(self.size, self._deleted, elapsed)

    def next_size(self, size: int, deleted: int, elapsed: float) -> int:
        """The size of the batch after one of *size* runs that deleted *deleted* in *elapsed* s."""
        aim = AIM * self.target
        cost = elapsed / deleted
        if self._cost_per_run is not None and elapsed <= aim:
            cost = (cost + self._cost_per_run) / 2
        self._cost_per_run = cost
        wanted = int(aim / cost) if cost > 0 else self._max
        return max(1, min(self._max, 2 * size, wanted))

    def _write_archive(self, conn: Connection, dialect: str, ids: list[str]) -> None:
        assert self._archive is not None
        (_, run_select, run_stamps), *child_selects = _archive_selects(dialect)
        lines: dict[str, dict[str, Any]] = {}
        for record in _records(conn.execute(run_select, {"ids": ids}), run_stamps):
            lines[record["id"]] = {"run": record, **{t.name: [] for t in RUN_CHILD_TABLES}}
        for name, statement, stamps in child_selects:
            for record in _records(conn.execute(statement, {"ids": ids}), stamps):
                lines[record["run_id"]][name].append(record)
        data = b"".join(
            json.dumps(line, sort_keys=True, ensure_ascii=False).encode() + b"\n"
            for line in lines.values()
        )
        try:
            self._archive.write(data)
        except OSError as exc:
            # Not a database error: the batch rolls back, nothing is deleted.
            raise ProjectionError(
                f"cannot write the sweep archive: {exc.strerror or exc}; "
                f"the batch of {len(ids)} runs was not deleted"
            ) from exc

    def close(self) -> None:
        if self._archive is not None:
            self._archive.close()
        self._archive = None
