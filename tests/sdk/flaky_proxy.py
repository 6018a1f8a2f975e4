"""A loopback TCP proxy that breaks connections on command, to test the SDK's recovery.

* ``cut()``: drop every open connection now (an SSE stream mid-flight, say);
* ``swallow(n)``: the next ``n`` responses are lost: the request reaches the
  server (which acts on it), then the connection closes before the client
  sees a byte of the answer, as when a network drops a reply.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class FlakyProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._to_swallow = 0
        self.swallowed = 0
        self.connections = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def swallow(self, n: int = 1) -> None:
        with self._lock:
            self._to_swallow += n

    def cut(self) -> int:
        """Close every open connection; returns how many sockets were closed."""
        with self._lock:
            socks, self._open = list(self._open), set()
        for s in socks:
            _kill(s)
        return len(socks)

    def close(self) -> None:
        self._closed = True
        _kill(self._listener)
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                _kill(client)
                continue
            with self._lock:
                self._open |= {client, upstream}
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, is_reply: bool) -> None:
        for data in _chunks(src):
            if is_reply and self._take_swallow():
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        _kill(src)
        _kill(dst)

    def _take_swallow(self) -> bool:
        with self._lock:
            if self._to_swallow <= 0:
                return False
            self._to_swallow -= 1
            self.swallowed += 1
            return True


def _chunks(sock: socket.socket) -> Iterator[bytes]:
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        yield data


def _kill(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
