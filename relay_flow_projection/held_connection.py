"""The connections the executors keep checked out between calls (issue 21).

A call that checks a connection out of SQLAlchemy's pool and returns it pays
for the checkout, the reset on return (a rollback; on PostgreSQL also the
switch into and out of autocommit) and, on SQLite, the autobegin and rollback
around a read: about half of what a read costs. Both executors therefore
keep the connection a call used, one per role (reads, writes), and hand it
to the next call -- within limits that keep what the pool guarantees:

* Briefly: a connection serves calls for ``HOLD_SECONDS`` after its checkout,
  then goes back to the pool, and a call finding it older checks one out
  again. Whatever the pool does on checkout (``pool_pre_ping``,
  ``pool_recycle``, replacing connections from before an outage it saw) still
  happens about once a second on a busy projection. A connection nobody asks
  for is returned by a daemon thread within ``HOLD_SECONDS`` more (``_reap``),
  so an idle service holds nothing; ``Engine.dispose()`` closes held ones at
  once (``_release_on_dispose``).
* From a ``QueuePool`` with room to spare only: a connection is kept only
  while the pool is not in overflow, so another user of the engine (another
  projection, the application's own queries) always finds one. ``NullPool``
  (the usual choice behind PgBouncer), ``StaticPool`` and
  ``SingletonThreadPool`` are used as configured.
* Only where nothing stays open on it between calls: the dialect says which
  roles qualify (``dialect.keeps_between_calls``).
* Never after a failure, after ``Engine.dispose()`` replaced the pool it came
  from, after ``release(for_good=True)`` (the projection's ``close()``), nor in a
  forked child: the parent's connections are the parent's.

A slot holds one connection: under concurrency, other calls use the pool as
before. The asyncio executor's slots (``LoopHeldConnection``) keep the same
rules, and one more: an async driver's connection can only be closed by
awaiting on the event loop it belongs to, which neither a finalizer nor the
reaper thread can do, so a task on that loop returns it (see the class).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import Pool, QueuePool

if TYPE_CHECKING:  # the asyncio extension loads only for the async facade
    from sqlalchemy.ext.asyncio import AsyncSession

# How long after its checkout a connection may serve further calls.
HOLD_SECONDS = 1.0

# Where and when a connection was checked out: (the pool, time.monotonic()).
Lease = tuple[Pool, float]


class HeldConnection:
    """At most one connection of *engine*'s pool, kept between calls."""

    __slots__ = (
        "__weakref__",
        "_closed",
        "_engine",
        "_guard",
        "_held",
        "_owner",
        "_pool",
        "_since",
    )

    def __init__(self, engine: Engine, *, enabled: bool) -> None:
        self._engine = engine
        self._guard = threading.Lock()
        self._held: Connection | None = None
        self._pool: Pool | None = None  # the pool _held came from
        self._since = 0.0  # when _held was checked out (time.monotonic)
        self._owner: object = None  # who may use _held (_owner_here)
        # A slot that may never hold anything starts closed: put() refuses.
        self._closed = not enabled
        _slots.add(self)
        _release_on_dispose(engine)

    def take(self) -> tuple[Connection | None, Lease]:
        """The held connection if it may serve this call (else None: check one out),
        and its lease, for put()."""
        with self._guard:
            if self._held is not None and self._owner is not self._owner_here():
                return None, self.lease()  # not ours to use or end here
            held, self._held = self._held, None
            pool, since = self._pool, self._since
        if held is not None:
            current, now = self._engine.pool, time.monotonic()
            if pool is current and now - since < HOLD_SECONDS:
                return held, (current, since)
            _retire(held, pool_gone=pool is not current)
        return None, self.lease()

    def lease(self) -> Lease:
        """The lease of a connection about to be checked out (a repeat's, or take()'s
        when nothing may be reused). Taken before the checkout: a dispose() in
        between makes it name the old pool, and the connection is then retired
        rather than kept."""
        return self._engine.pool, time.monotonic()

    def put(self, conn: Connection, lease: Lease) -> bool:
        """Keep *conn* for the next call, or False: close it."""
        pool, since = lease
        if (
            self._closed
            or conn.invalidated
            or conn.closed
            or time.monotonic() - since >= HOLD_SECONDS
            or pool is not self._engine.pool  # disposed meanwhile
            or not isinstance(pool, QueuePool)
            or pool.checkedout() >= pool.size()  # none to spare: give it back
        ):
            return False
        owner = self._owner_here()
        with self._guard:
            if self._held is not None or self._closed:
                return False
            self._held, self._pool, self._since, self._owner = conn, pool, since, owner
        self._watch()
        return True

    def _owner_here(self) -> object:
        """Who is calling, as far as using a held connection goes: anyone, here."""
        return None

    def _watch(self) -> None:
        """Make sure the held connection is returned once it expires: the reaper."""
        if _reaper is None:
            _start_reaper()

    def reap(self) -> bool:
        """The reaper's round for this slot; True if a connection stays held."""
        return self.release(expired_only=True)

    def remaining(self) -> float:
        """Seconds until the held connection expires (0 if none is held)."""
        with self._guard:
            if self._held is None:
                return 0.0
            return max(0.0, self._since + HOLD_SECONDS - time.monotonic())

    @property
    def engine(self) -> Engine:
        return self._engine

    def release(self, *, for_good: bool = False, expired_only: bool = False) -> bool:
        """Return the held connection (after an outage; *for_good*: hold nothing from
        now on; *expired_only*: only one past HOLD_SECONDS). True if one stays held."""
        with self._guard:
            if for_good:
                self._closed = True
            held = self._held
            if held is None:
                return False
            if expired_only and time.monotonic() - self._since < HOLD_SECONDS:
                return True
            self._held = None
            pool = self._pool
        _retire(held, pool_gone=pool is not self._engine.pool)
        return False

    def abandon_in_child(self) -> None:
        """In a forked child: forget the parent's connection without touching it."""
        self._guard = threading.Lock()  # a parent thread may have held it at the fork
        if self._held is not None:
            _inherited.append(self._held)
            self._held = None


def _retire(conn: Connection, *, pool_gone: bool) -> None:
    """End a connection no slot holds any more.

    *pool_gone*: ``Engine.dispose()`` replaced the pool it came from; returned
    there, it would stay open until that pool is garbage and then be dropped
    unclosed, so it is closed for good (invalidated) instead.
    """
    if pool_gone:
        conn.invalidate()
    else:
        conn.close()


class LoopHeldConnection(HeldConnection):
    """The async executor's slot: a held connection belongs to an event loop.

    What it holds is the sync face (used in the executor's greenlets) of an
    async driver's connection, which only its own event loop can close. So:

    * a call on another loop neither uses nor ends it (it checks one out);
    * a task on its loop, the keeper, returns it once it expires -- or when
      the loop ends: ``asyncio.run()`` cancels the tasks left before closing
      the loop, and the keeper ends the connection then. (A loop closed
      without cancelling its tasks leaves it to the garbage collector, as any
      connection a cancelled task still holds.)
    * ``Engine.dispose()``, ``release()`` and ``AsyncRunProjection.close()``
      end it at once on its loop (in a greenlet: ``AsyncEngine.dispose``
      disposes there); called elsewhere they wake its keeper instead.
    """

    __slots__ = ("_greenlets", "_keeper")

    def __init__(self, engine: Engine, *, enabled: bool, greenlets: AsyncSession) -> None:
        super().__init__(engine, enabled=enabled)
        self._greenlets = greenlets  # only its run_sync: a greenlet on the running loop
        self._keeper: asyncio.Task[None] | None = None

    def _owner_here(self) -> object:
        return _running_loop()

    def take(self) -> tuple[Connection | None, Lease]:
        self._forget_orphan()
        return super().take()

    def _forget_orphan(self) -> None:
        """Drop a connection whose loop was closed without ending its tasks: nothing can
        close it any more, and kept here it would keep the slot from serving anyone.
        (The garbage collector then reports it, as it does any such connection.)"""
        loop = self._owner
        if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_closed():
            with self._guard:
                if self._owner is loop:
                    self._held = self._owner = None
                    self._keeper = None  # a task of that loop

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        keeper = self._keeper
        if keeper is None or keeper.done() or keeper.get_loop() is not loop:
            # A keeper of another loop sees it is no longer the keeper, and ends.
            self._keeper = loop.create_task(self._keep(), name="relay-flow-held-connection")

    def reap(self) -> bool:
        return False  # the reaper thread cannot close it; the keeper does

    def release(self, *, for_good: bool = False, expired_only: bool = False) -> bool:
        self._forget_orphan()
        loop = self._owner
        # Read without the guard: only its own loop's thread puts a connection here.
        if (
            self._held is not None
            and isinstance(loop, asyncio.AbstractEventLoop)
            and loop is not _running_loop()
        ):
            if for_good:
                self._closed = True
            keeper = self._keeper
            if keeper is not None:
                # It ends the connection (unless its loop closed just now: an orphan).
                with contextlib.suppress(RuntimeError):
                    keeper.get_loop().call_soon_threadsafe(keeper.cancel)
            return True
        holding = super().release(for_good=for_good, expired_only=expired_only)
        keeper = self._keeper
        if (
            not holding
            and not expired_only
            and keeper is not None
            and keeper.get_loop() is _running_loop()  # a task is only cancelled on its loop
        ):
            self._keeper = None
            if keeper is not asyncio.current_task():
                keeper.cancel()  # nothing left to keep
        return holding

    def abandon_in_child(self) -> None:
        super().abandon_in_child()
        self._keeper = None  # the parent's loop's task

    async def _keep(self) -> None:
        """Return the held connection when it expires, or when this task is cancelled
        (the loop is ending, or release() was called from elsewhere)."""
        me = asyncio.current_task()
        try:
            while self._keeper is me:
                await asyncio.sleep(self.remaining())
                if self._keeper is not me or not await self._greenlets.run_sync(self._expire):
                    return
        except asyncio.CancelledError:
            # Still the keeper: not cancelled by a release() on this loop, which
            # ended the connection itself (and a later put() may have a keeper now).
            if self._keeper is me:
                await self._greenlets.run_sync(lambda _session: self.release())
            raise

    def _expire(self, _session: Any) -> bool:
        """The keeper's round, in its greenlet: True if a connection stays held."""
        holding = self.release(expired_only=True)
        if not holding and self._keeper is asyncio.current_task():
            # Decided in the same step as the release: a put() before this task
            # ends starts a keeper of its own.
            self._keeper = None
        return holding


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# ------------------------------------------------------ the reaper ---

_slots: weakref.WeakSet[HeldConnection] = weakref.WeakSet()
_reaper: threading.Thread | None = None
_reaper_guard = threading.Lock()


def _start_reaper() -> None:
    global _reaper
    with _reaper_guard:
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name="relay-flow-reaper", daemon=True)
            _reaper.start()


def _reap() -> None:
    """Return held connections past HOLD_SECONDS; end once nothing is held."""
    global _reaper
    while True:
        time.sleep(HOLD_SECONDS)
        with _reaper_guard:
            if not _release_expired():
                _reaper = None
                return


def _release_expired() -> bool:
    """One round of the reaper (a function of its own: the sleeping frame keeps no
    slot, nor its engine, alive). True if a connection stays held."""
    holding = False
    for slot in list(_slots):
        # A connection failing to close is the pool's to drop; go on.
        with contextlib.suppress(Exception):
            holding = slot.reap() or holding
    return holding


# One listener per engine: the check and the registration happen together.
_disposal_guard = threading.Lock()


def _release_on_dispose(engine: Engine) -> None:
    """``Engine.dispose()`` closes what the engine's slots hold, at once.

    The pool closes only what is checked in, and a held connection is checked
    out: without this it would stay open after dispose() -- an open SQLite
    connection keeps the WAL file from being checkpointed into the database
    (a copy of the file taken then is not the database), an open server
    session keeps ``DROP DATABASE`` out. (A listener makes the engine
    dispatch connection events around each statement, ~10 us on PostgreSQL;
    SQLite engines have one already.)
    """
    with _disposal_guard:
        if not event.contains(engine, "engine_disposed", _on_engine_disposed):
            event.listen(engine, "engine_disposed", _on_engine_disposed)


def _on_engine_disposed(engine: Engine) -> None:
    for slot in list(_slots):
        if slot.engine is engine:
            slot.release()


# Connections a forked child inherited: referenced until the child exits, so
# that no garbage collection returns them to a pool (its reset would roll
# back on the parent's socket).
_inherited: list[Connection] = []


def _abandon_all_in_child() -> None:
    global _reaper, _reaper_guard
    _reaper = None  # threads do not survive fork
    _reaper_guard = threading.Lock()
    for slot in list(_slots):
        slot.abandon_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_abandon_all_in_child)
