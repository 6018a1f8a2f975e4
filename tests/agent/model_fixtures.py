"""Helpers for the model cache tests: a real HTTP file server on loopback, and builders.

``FileServer`` is a stdlib ``ThreadingHTTPServer`` (HTTP/1.1, keep-alive) that
serves byte strings and can misbehave per file, as real servers do:

* ``ignore_range``: answers every request with 200 and the whole file;
* ``drop_at``: closes the connection once the body reaches that file offset
  (``drops`` times, then behaves);
* ``corrupt``: serves the file with one byte flipped;
* ``statuses``: answers the first requests with these error statuses;
* ``hold_at``: stops sending at that offset until ``release()`` (a slow link).

Every request is logged (path, Range header, status, X-Agent header) so tests
can assert what went over the wire.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from corral.agent.models import (
    DownloadProgress,
    DownloadSettings,
    ModelCache,
    ModelKind,
    ModelManager,
    ModelSettings,
    ModelSpec,
)
from corral.core import VirtualClock

KIB = 1024
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
SEND_BLOCK = 16 * KIB


def blob(size: int, seed: int) -> bytes:
    """``size`` deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


def spec_for(
    name: str, data: bytes, *sources: str, kind: ModelKind = ModelKind.CHECKPOINT
) -> ModelSpec:
    return ModelSpec(
        name=name,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        sources=sources,
        kind=kind,
    )


def put(cache: ModelCache, spec: ModelSpec, data: bytes) -> Path:
    """Add a model to ``cache`` the way a finished download does (reserve, write, commit)."""
    cache.reserve(spec)
    cache.part_path(spec.sha256).write_bytes(data)
    return cache.commit(spec)


class JumpClock(VirtualClock):
    """A virtual clock whose ``sleep`` returns at once, having moved time; records delays."""

    def __init__(self) -> None:
        super().__init__(start=1_000.0)
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


@dataclass
class Served:
    data: bytes
    ignore_range: bool = False
    drop_at: int | None = None
    drops: int = 1
    corrupt: bool = False
    statuses: list[int] = field(default_factory=list)
    retry_after: int | None = None  # sent with those statuses
    hold_at: int | None = None
    gate: threading.Event = field(default_factory=threading.Event)


@dataclass
class Hit:
    """One request, logged when it arrives; ``status`` is filled in before the head is sent
    (so a client that has read the head sees it, even while the body is still going)."""

    path: str
    range: str | None
    agent: str | None
    status: int = 0


class FileServer:
    """Serves registered byte strings at ``http://127.0.0.1:<port>/<path>``."""

    def __init__(self) -> None:
        self.files: dict[str, Served] = {}
        self.log: list[Hit] = []
        self._lock = threading.Condition()
        self._httpd = _Httpd(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def add(self, path: str, data: bytes, **behaviour: object) -> str:
        self.files[path] = Served(data, **behaviour)  # type: ignore[arg-type]
        return self.url(path)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{path}"

    def hits(self, path: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.log if h.path == path]

    def release(self, path: str) -> None:
        self.files[path].gate.set()

    def record(self, hit: Hit) -> None:
        with self._lock:
            self.log.append(hit)
            self._lock.notify_all()

    async def arrived(self, path: str, count: int) -> None:
        """Wait (at most 10 s) until ``count`` requests for ``path`` have arrived."""

        def wait() -> bool:
            with self._lock:
                return self._lock.wait_for(lambda: len(self.hits(path)) >= count, timeout=10)

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"{count} requests for {path} never arrived: {self.hits(path)}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        for served in self.files.values():
            served.gate.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def file_server() -> Iterator[FileServer]:
    server = FileServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    owner: FileServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Httpd
    _hit: Hit

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.lstrip("/")
        hit = Hit(path, self.headers.get("Range"), self.headers.get("X-Agent"))
        self.server.owner.record(hit)
        self._hit = hit
        self._answer(self.server.owner.files.get(path), hit.range)

    def _answer(self, served: Served | None, range_header: str | None) -> int:
        if served is None or served.statuses:
            status = served.statuses.pop(0) if served else 404
            retry = served.retry_after if served else None
            self._head(status, 0, {"Retry-After": str(retry)} if retry is not None else {})
            return status
        data = memoryview(served.data)  # no copy per request: benchmarks serve big files
        if served.corrupt:
            flipped = bytearray(served.data)
            flipped[len(data) // 2] ^= 0xFF
            data = memoryview(bytes(flipped))
        match = None if served.ignore_range else _RANGE.match(range_header or "")
        if match is None:
            self._head(200, len(data), {})
            self._body(served, data, 0)
            return 200
        start = int(match.group(1))
        end = min(int(match.group(2) or len(data) - 1), len(data) - 1)
        if start >= len(data):
            self._head(416, 0, {"Content-Range": f"bytes */{len(data)}"})
            return 416
        self._head(206, end - start + 1, {"Content-Range": f"bytes {start}-{end}/{len(data)}"})
        self._body(served, data[start : end + 1], start)
        return 206

    def _head(self, status: int, length: int, extra: dict[str, str]) -> None:
        self._hit.status = status
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", "application/octet-stream")
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()

    def _body(self, served: Served, body: memoryview, start: int) -> None:
        """Send ``body`` (file bytes from ``start``), misbehaving as ``served`` says."""
        stop_at = len(body)
        drop = served.drop_at
        if drop is not None and served.drops > 0 and start <= drop < start + len(body):
            served.drops -= 1
            stop_at = drop - start
        try:
            for i in range(0, stop_at, SEND_BLOCK):
                if served.hold_at is not None and start + i >= served.hold_at:
                    served.gate.wait(timeout=30)
                self.wfile.write(body[i : min(i + SEND_BLOCK, stop_at)])
                self.wfile.flush()
            if stop_at < len(body):
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
        except OSError:  # the client went away (a paused download): fine
            self.close_connection = True


@asynccontextmanager
async def agent(
    root: Path,
    name: str = "agent-a",
    *,
    budget: int = 10 * 1024 * KIB,
    clock: JumpClock | None = None,
    **downloads: Any,
) -> AsyncIterator[ModelManager]:
    """A model manager as one agent holds it: its own cache dir, client and X-Agent header."""
    settings = ModelSettings(
        root / name,
        budget,
        DownloadSettings(**{"chunk_bytes": 64 * KIB, "jitter": 0.0, **downloads}),
    )
    async with httpx.AsyncClient(timeout=10) as client:
        models = ModelManager.open(
            settings, clock or JumpClock(), client=client, headers_for=lambda _: {"X-Agent": name}
        )
        try:
            yield models
        finally:
            await models.aclose()


async def reached(
    models: ModelManager, want: Callable[[DownloadProgress], bool]
) -> DownloadProgress:
    """Wait (at most 10 s of real time) for a progress update that satisfies ``want``."""
    seen = asyncio.get_running_loop().create_future()

    def check(progress: DownloadProgress) -> None:
        if want(progress) and not seen.done():
            seen.set_result(progress)

    stop = models.downloader.add_listener(check)
    try:
        for progress in models.downloader.progress():
            check(progress)
        return await asyncio.wait_for(seen, timeout=10)
    finally:
        stop()
