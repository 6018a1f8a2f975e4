"""Fetching one model's bytes from one source into its partial file.

HTTP sources are read in chunks of ``chunk_bytes``, each one request with
``Range: bytes=<from>-<to>``; the partial file's length is where the next
request starts, so a dropped connection, a paused download or an agent
restart resumes where it stopped. A server that ignores Range (answers 200
with the whole file) is handled: the partial file is started over from byte 0
and the whole body is taken. File sources (``file://`` URLs or absolute paths,
e.g. shared storage) are copied with the same resume rule.

Every byte written also feeds a running sha256, so verifying at the end costs
nothing more; a partial file found on disk is hashed once when it is opened.

Failures raise ``SourceError``; ``transient`` says whether another try at the
same source could work (dropped connection, timeout, 5xx, 429) or not (404,
wrong size, a compressed body).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from corral.agent.models.cache import hash_prefix
from corral.agent.models.errors import SourceError

READ_BLOCK = 1024 * 1024  # bytes read per call from a file source
_TRANSIENT_STATUS = frozenset({408, 425, 429})  # plus every 5xx
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


@dataclass(frozen=True, slots=True)
class Hashed:
    """What a closed partial file held: its length and a sha256 fed with those bytes."""

    offset: int
    digest: hashlib._Hash


class PartFile:
    """A partial download: its file, its length, and the sha256 of what it holds."""

    def __init__(self, path: Path, digest: hashlib._Hash, offset: int) -> None:
        self.path = path
        self.offset = offset
        self._digest = digest
        self._file = open(path, "ab")  # noqa: SIM115 - closed by close(), it spans many requests

    @classmethod
    async def open(cls, path: Path, total: int, *, known: Hashed | None = None) -> PartFile:
        """Open (or create) ``path``, hashing what it holds unless ``known`` still matches it.

        A file longer than ``total`` cannot be a prefix of the model: it is deleted.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        size = path.stat().st_size if path.exists() else 0
        if size > total:
            path.unlink()
            size = 0
        if size == 0:
            return cls(path, hashlib.sha256(), 0)
        if known is not None and known.offset == size:
            return cls(path, known.digest.copy(), size)
        digest, offset = await asyncio.to_thread(hash_prefix, path)
        return cls(path, digest, offset)

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._digest.update(data)
        self.offset += len(data)

    def restart(self) -> None:
        """Forget every byte: the next write is byte 0 again."""
        self._file.truncate(0)
        self._file.seek(0)
        self._digest = hashlib.sha256()
        self.offset = 0

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def sync(self) -> None:
        """Flush to the disk (before the file is verified and moved into the cache)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> Hashed:
        """Close the file; returns what it holds so a later resume can skip re-hashing."""
        self._file.close()
        return Hashed(self.offset, self._digest.copy())

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """One try at one source: which model, how big, and whom to tell about progress."""

    model: str
    source: str
    total: int
    chunk_bytes: int
    # called after each write with the partial file's length, and whether a response just
    # ended there (so a stalled download's last figure is published, not throttled away)
    on_bytes: Callable[[int, bool], None]
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. auth for the corral server


async def fetch(request: FetchRequest, part: PartFile, client: httpx.AsyncClient) -> None:
    """Fill ``part`` up to ``request.total`` bytes from ``request.source``, or raise."""
    scheme = urlsplit(request.source).scheme
    if scheme in ("http", "https"):
        await _fetch_http(request, part, client)
    else:
        await _fetch_file(request, part)


async def _fetch_http(request: FetchRequest, part: PartFile, client: httpx.AsyncClient) -> None:
    while part.offset < request.total:
        start = part.offset
        end = min(start + request.chunk_bytes, request.total) - 1
        headers = {
            **request.headers,
            "Range": f"bytes={start}-{end}",
            "Accept-Encoding": "identity",
        }
        try:
            async with client.stream("GET", request.source, headers=headers) as response:
                await _receive(request, part, response, start)
        except httpx.TransportError as exc:
            raise _fail(
                request, f"{type(exc).__name__} {exc} at byte {part.offset}", transient=True
            ) from exc


async def _receive(
    request: FetchRequest, part: PartFile, response: httpx.Response, start: int
) -> None:
    """Write one response's body into ``part``; checks status, range and size first."""
    limit = _body_limit(request, part, response, start)
    encoding = response.headers.get("content-encoding", "identity").lower()
    if encoding != "identity":
        raise _fail(request, f"sent a {encoding}-encoded body; need the raw file", transient=False)
    async for data in response.aiter_raw():
        if part.offset + len(data) > limit:
            raise _fail(request, f"sent more than the {limit} bytes asked for", transient=False)
        part.write(data)
        request.on_bytes(part.offset, False)
    request.on_bytes(part.offset, True)
    if part.offset < limit:
        raise _fail(request, f"closed the body at byte {part.offset} of {limit}", transient=True)


def _body_limit(request: FetchRequest, part: PartFile, response: httpx.Response, start: int) -> int:
    """Where this response's body must end in the file; restarts ``part`` on a full body."""
    status = response.status_code
    if status == 206:
        first, last, length = _content_range(request, response)
        if first != start:
            raise _fail(
                request, f"answered bytes {first}- when asked for {start}-", transient=False
            )
        _check_length(request, length)
        return last + 1
    if status == 200:  # Range ignored: the body is the whole file, from byte 0
        length_header = response.headers.get("content-length")
        _check_length(request, int(length_header) if length_header else None)
        if part.offset:
            part.restart()
        return request.total
    if status == 416:  # our partial file does not fit this file: start over
        part.restart()
        raise _fail(request, "range not satisfiable; starting over", transient=True)
    transient = status in _TRANSIENT_STATUS or status >= 500
    message = f"HTTP {status} {response.reason_phrase}".rstrip()
    raise _fail(request, message, transient=transient, retry_after=_retry_after(response))


def _content_range(request: FetchRequest, response: httpx.Response) -> tuple[int, int, int | None]:
    match = _CONTENT_RANGE.match(response.headers.get("content-range", ""))
    if not match:
        got = response.headers.get("content-range")
        raise _fail(request, f"206 with a bad Content-Range {got!r}", transient=False)
    total = None if match.group(3) == "*" else int(match.group(3))
    return int(match.group(1)), int(match.group(2)), total


def _check_length(request: FetchRequest, length: int | None) -> None:
    if length is not None and length != request.total:
        raise _fail(
            request, f"serves {length} bytes; the registry says {request.total}", transient=False
        )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


async def _fetch_file(request: FetchRequest, part: PartFile) -> None:
    path = Path(unquote(urlsplit(request.source).path))
    try:
        size = path.stat().st_size
        if size != request.total:
            raise _fail(
                request, f"has {size} bytes; the registry says {request.total}", transient=False
            )
        with open(path, "rb") as f:
            f.seek(part.offset)
            while part.offset < request.total:
                want = min(READ_BLOCK, request.total - part.offset)
                data = await asyncio.to_thread(f.read, want)
                if not data:
                    raise _fail(request, f"ended at byte {part.offset}", transient=True)
                part.write(data[: request.total - part.offset])
                request.on_bytes(part.offset, part.offset == request.total)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise _fail(request, f"{type(exc).__name__}: {exc.strerror}", transient=False) from exc
    except OSError as exc:
        raise _fail(request, f"{type(exc).__name__}: {exc}", transient=True) from exc


def _fail(
    request: FetchRequest, message: str, *, transient: bool, retry_after: float | None = None
) -> SourceError:
    return SourceError(
        request.model, request.source, message, transient=transient, retry_after=retry_after
    )
