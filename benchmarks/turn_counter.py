"""A loopback TCP proxy that counts round trips (client turns) on one upstream server.

:class:`TurnCounter` listens on 127.0.0.1 and forwards every byte to the
server and back. It counts *turns*: a turn begins when the client sends after
the server last spoke on that connection (or first of all). A client that
writes one request in several TCP segments, or a server answering in several,
still makes one turn; a client that waits for an answer before its next
statement makes one turn per statement. So the count is the number of times
the client waited for the server: its round trips, whatever the driver sends
(psycopg's ``BEGIN`` and ``COMMIT`` included, which no cursor hook sees).

It is exact, not sampled: a call returns only after its last answer went
through the proxy, and the proxy records the server's bytes before it
forwards them, so no turn of one call is counted in the next. Standard
library only, plus SQLAlchemy's URL parsing (tests/test_turn_counter.py loads
it by path).
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from types import TracebackType

from sqlalchemy.engine import make_url


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
