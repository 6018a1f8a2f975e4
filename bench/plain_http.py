"""A plain HTTP/1.1 client for the corral peer: the standard library's ``http.client``.

What the benchmark's load generator costs is not what is being measured, yet on
a 2-core machine it runs beside the server and its agents. httpx spends about
0.8 ms of CPU per job in the concurrent shape (building each request through its
URL, cookie and connection-pool layers, and reading SSE line by line), as much
as the whole server; ``http.client`` (what urllib3 and requests are built on,
and about what a Go or Node web app pays) spends about 0.25 ms. Each thread
keeps its own keep-alive connection (``http.client`` sets ``TCP_NODELAY``), and
the event stream is split into frames from the raw bytes.

``bench/e2e.py --client httpx`` measures with httpx instead.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlencode, urlsplit

Frame = tuple[str, int, str | None]  # event kind, its seq, its job id


class PlainHttp:
    def __init__(self, base_url: str, headers: dict[str, str], timeout: float = 60.0) -> None:
        self._host = urlsplit(base_url).netloc
        self._headers = headers
        self._timeout = timeout
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []  # every one, for ``close``
        self._lock = threading.Lock()

    def post(self, path: str, body: bytes) -> bytes:
        """POST a JSON ``body``; the response body (raises on a status that is not 2xx)."""
        headers = self._headers | {"Content-Type": "application/json"}
        for retry in (False, True):  # a kept connection the server closed meanwhile: once more
            conn = self._connection()
            try:
                conn.request("POST", path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self._local.conn = None
                if retry:
                    raise
                continue
            if not 200 <= reply.status < 300:
                raise RuntimeError(f"POST {path}: {reply.status} {data[:500]!r}")
            return data
        raise AssertionError("unreachable")

    def events(self, path: str, params: dict[str, list[str]], last: int) -> Iterator[Frame]:
        """Follow an SSE stream (from after ``last``, when not 0) on a connection of its own."""
        conn = self._track(http.client.HTTPConnection(self._host, timeout=None))
        headers = self._headers | ({"Last-Event-ID": str(last)} if last else {})
        try:
            conn.request("GET", f"{path}?{urlencode(params, doseq=True)}", headers=headers)
            reply = conn.getresponse()
            if reply.status != 200:
                raise RuntimeError(f"GET {path}: {reply.status} {reply.read()[:500]!r}")
            buffered = b""
            while chunk := reply.read1(65536):
                buffered += chunk
                *frames, buffered = buffered.split(b"\n\n")
                for frame in frames:
                    parsed = _frame(frame)
                    if parsed is not None:
                        yield parsed
        finally:
            conn.close()

    def close(self) -> None:
        """Close every connection opened so far; a stream being read ends (EOF)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            if conn.sock is not None:
                with contextlib.suppress(OSError):  # wakes a thread blocked reading it
                    conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self._host, timeout=self._timeout)
            self._local.conn = self._track(conn)
        return conn

    def _track(self, conn: http.client.HTTPConnection) -> http.client.HTTPConnection:
        with self._lock:
            self._opened.append(conn)
        return conn


def _frame(frame: bytes) -> Frame | None:
    """One SSE frame's event kind, id and job id; None for a comment (keep-alive)."""
    kind, seq, data = "", 0, None
    for line in frame.split(b"\n"):
        if line.startswith(b"id:"):
            seq = int(line[3:])
        elif line.startswith(b"event:"):
            kind = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data = line[5:]
    if data is None:
        return None
    return kind, seq, json.loads(data).get("job_id")
