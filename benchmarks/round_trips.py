"""Round trips per call on PostgreSQL, counted on the wire by a loopback TCP proxy.

:class:`TurnCounter` listens on 127.0.0.1 and forwards every byte to the
server and back. It counts *turns*: a turn begins when the client sends after
the server last spoke (or first of all). A client that writes one request in
several TCP segments, or the server answering in several, still makes one
turn; a client that waits for an answer before its next statement makes one
turn per statement. So the count is the number of times a call waited for the
server: its round trips, whatever the driver sends in between (psycopg's
``BEGIN`` and ``COMMIT`` included, which no cursor hook sees).

It is exact, not sampled: a call returns only after its last answer went
through the proxy, and the proxy records the server's bytes before it
forwards them, so no turn of one call can be counted in the next.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from sqlalchemy.engine import make_url

from relay_flow_projection import (
    AsyncRunProjection,
    NodeSessionRegistration,
    RunProjection,
    RunStart,
    RunState,
    create_async_engine,
    create_engine,
)

from .bare_core import BareCore, BareCoreAsync
from .dataset import Shape, run_id
from .raw_async import async_url
from .sections import Target

CALLS = 20  # per operation and side; the count is the same for each call


class TurnCounter:
    """A counting TCP proxy to (host, port) on a free loopback port."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.turns = 0
        self._lock = threading.Lock()
        self._server_spoke: dict[int, bool] = {}
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            key = client.fileno()
            self._server_spoke[key] = True
            threading.Thread(
                target=self._pump, args=(client, server, key, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, key, False), daemon=True
            ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, key: int, upward: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    if upward:
                        if self._server_spoke[key]:
                            self.turns += 1
                        self._server_spoke[key] = False
                    else:
                        self._server_spoke[key] = True
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def url(self, url: str) -> str:
        """*url* pointed at this proxy."""
        parsed = make_url(url).set(host="127.0.0.1", port=self.port)
        return parsed.render_as_string(hide_password=False)

    def count(self) -> int:
        with self._lock:
            return self.turns

    def close(self) -> None:
        self.listener.close()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> TurnCounter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _start(k: int) -> RunStart:
    return RunStart(f"rt-{k:09d}", "repo-1", "workflow-7", f"T-rt{k}", f"KEY-rt{k}")


def _calls(runs: int, active: list[str]) -> dict[str, Callable[[Any, int], Any]]:
    return {
        "insert_start": lambda s, k: s.insert_start(_start(k), datetime.now(UTC)),
        "update_node": lambda s, k: s.update_node(
            active[k % len(active)], RunState.RUNNING, "build", f"rt-{k}"
        ),
        "get_run": lambda s, k: s.get_run(run_id((k * 7_919) % runs)),
        "register_node_session": lambda s, k: s.register_node_session(
            NodeSessionRegistration(run_id((k * 104_729) % runs), "build", f"rt-{k}")
        ),
    }


def round_trips(target: Target, runs: int) -> dict[str, Any]:
    """Round trips per call of each operation: layer and bare Core, sync (psycopg) and
    async (psycopg, asyncpg), each on its own connections through one proxy."""
    url = make_url(target.url)
    assert url.host is not None
    active = [run_id(i) for i in Shape(runs).active_indexes()]
    calls = _calls(runs, active)
    serial = iter(range(10**9))
    results: dict[str, Any] = {}
    with TurnCounter(url.host, url.port or 5432) as proxy:
        proxied = proxy.url(target.url)
        projection = RunProjection(create_engine(proxied))
        bare = BareCore(proxied)
        sides: dict[str, Any] = {"layer": projection, "bare": bare}
        sync: dict[str, dict[str, float]] = {}
        for name, call in calls.items():
            sync[name] = {}
            for side_name, side in sides.items():
                call(side, next(serial))  # warm: connected, dialect initialized, compiled
                before = proxy.count()
                for _ in range(CALLS):
                    call(side, next(serial))
                sync[name][side_name] = (proxy.count() - before) / CALLS
        bare.close()
        projection.engine.dispose()
        results["psycopg"] = sync
        for driver in ("psycopg", "asyncpg"):
            results[f"{driver}_async"] = asyncio.run(
                _async_round_trips(proxy, async_url(proxied, driver), calls, serial)
            )
    return results


async def _async_round_trips(
    proxy: TurnCounter, url: str, calls: dict[str, Callable[[Any, int], Any]], serial: Any
) -> dict[str, dict[str, float]]:
    engine = create_async_engine(url)
    sides: dict[str, Any] = {
        "layer": AsyncRunProjection(engine),
        "bare": await BareCoreAsync.open(url),
    }
    measured: dict[str, dict[str, float]] = {}
    try:
        for name, call in calls.items():
            measured[name] = {}
            for side_name, side in sides.items():
                await call(side, next(serial))
                before = proxy.count()
                for _ in range(CALLS):
                    await call(side, next(serial))
                measured[name][side_name] = (proxy.count() - before) / CALLS
    finally:
        await sides["bare"].close()
        await engine.dispose()
    return measured
