"""A loopback TCP proxy that can lose a COMMIT's answer, for the ambiguous-commit tests.

Unarmed, it relays bytes both ways. ``arm()`` makes it act on the next client
message that carries ``COMMIT`` (PostgreSQL's simple query and MySQL's
COM_QUERY both send it as text): with ``forward=True`` the COMMIT reaches the
server and the server's answer is swallowed (the server commits, the client
never hears it); with ``forward=False`` it never reaches the server (which
rolls the transaction back when the connection goes). Either way
``meanwhile`` runs next -- another caller writing in between -- and then
both sides of that connection are closed, as a network failure would leave them.

``requests`` counts client messages relayed (one per round trip the client
starts), for tests that count round trips.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable
from types import TracebackType

# The statement COMMIT, not a word containing it ("ISOLATION LEVEL READ COMMITTED").
_COMMIT = re.compile(rb"(?<![A-Za-z_])COMMIT(?![A-Za-z_])")


class CommitDroppingProxy:
    def __init__(self, server_host: str, server_port: int) -> None:
        self._server = (server_host, server_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._guard = threading.Lock()
        self._armed: tuple[Callable[[], None], bool] | None = None
        self._sockets: list[socket.socket] = []
        self._closing = False
        self.requests = 0
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, meanwhile: Callable[[], None] = lambda: None, *, forward: bool = True) -> None:
        """Lose the next COMMIT's answer (forward=True) or the COMMIT itself (False)."""
        with self._guard:
            self._armed = (meanwhile, forward)
            self.dropped.clear()

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        with self._guard:
            for sock in self._sockets:
                _close(sock)

    def __enter__(self) -> CommitDroppingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._server)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._guard:
                self._sockets += [client, server]
            link = _Link(client, server)
            threading.Thread(target=self._to_server, args=(link,), daemon=True).start()
            threading.Thread(target=self._to_client, args=(link,), daemon=True).start()

    def _take_arm(self, data: bytes) -> tuple[Callable[[], None], bool] | None:
        with self._guard:
            armed = self._armed
            if armed is None or not _COMMIT.search(data):
                return None
            self._armed = None
            return armed

    def _to_server(self, link: _Link) -> None:
        while (data := _receive(link.client)) is not None:
            armed = self._take_arm(data)
            if armed is None:
                with self._guard:
                    self.requests += 1
                if not _send(link.server, data):
                    break
                continue
            meanwhile, forward = armed
            if forward:
                link.swallow.set()
                _send(link.server, data)
                link.answered.wait(10)  # the server committed and said so
            meanwhile()
            self.dropped.set()
            break
        link.close()

    def _to_client(self, link: _Link) -> None:
        while (data := _receive(link.server)) is not None:
            if link.swallow.is_set():
                link.answered.set()
                break
            if not _send(link.client, data):
                break
        link.answered.set()
        if not link.swallow.is_set():
            link.close()  # the server hung up (asyncpg waits for that when it closes)


class _Link:
    """One client connection and the server connection it is relayed to."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.swallow = threading.Event()  # set: the server's next answer is lost
        self.answered = threading.Event()

    def close(self) -> None:
        _close(self.client)
        _close(self.server)


def _receive(sock: socket.socket) -> bytes | None:
    try:
        data = sock.recv(65536)
    except OSError:
        return None
    return data or None


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
