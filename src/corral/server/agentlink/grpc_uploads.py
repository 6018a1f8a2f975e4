"""Chunked, resumable, idempotent blob uploads (the server side of ``UploadBlob``).

A large result travels in chunks on its own call so no stream message grows
past the message size limit. The blob id is the content address
``uploads/<allocation>/<attempt>/<sha256>``, so

* a retried upload of the same bytes returns the same id and stores nothing
  new (a retried result never becomes a second result);
* a chunk at an offset already received is skipped, and a call that starts
  with an empty chunk is answered at once with how much has arrived, so a
  client cut off half-way resumes where it stopped;
* a result may only name blobs of its own allocation and attempt
  (``stored_for``): an agent cannot pass off another job's bytes as its own.

An upload costs the server nothing until the caller is known to be entitled
to it: every call names its node (``corral.proto.caller``), and the first
chunk's allocation must be that node's current attempt, still running
(``Uploader.standing``, asked of the store); anything else is refused before
a file exists. Unfinished uploads are capped per node and in all
(``agents.max_uploads_per_node``, ``agents.max_uploads``): past a cap a new
one is refused with RESOURCE_EXHAUSTED and a ``retry-after-s`` trailer (the
agent keeps its report and tries again later).

Partial uploads are assembled in a scratch file beside the blob store's
files (``BlobStore.scratch``; never in memory, so a checkpoint of hundreds
of MiB costs the server disk, not RAM), hashed as their bytes arrive,
bounded by ``max_bytes`` each, and moved into place when complete; one with
no chunk for ``idle_s`` is forgotten and its file deleted. The file is
opened for each chunk and closed at once, and ``FetchBlob`` reads a blob a
chunk at a time the same way (``chunks``): no descriptor is held between
chunks, so none is held by an upload an agent leaves half-done.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.core.clock import Clock
from corral.core.errors import CorralError
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.server.agentlink.base import Standing
from corral.server.blobs import BlobStore, StoredBlob

log = logging.getLogger("corral.server.agentlink")

MAX_NAME = 1024
"""Longest upload name (``<job id>/<file name>``); it is kept in memory while unfinished."""

Key = tuple[str, int, str]  # allocation id, attempt, name


class UploadError(CorralError):
    """A refused upload; ``code`` is the gRPC status name to answer with, ``retry_after_s``
    set when the refusal is a cap that frees up with time (the agent tries again)."""

    def __init__(self, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Uploader:
    """Who is uploading: the calling agent's node, and what it may upload for an
    allocation and attempt (``AgentInbound.upload_standing``)."""

    node: str
    standing: Callable[[str, int], Awaitable[Standing]]


def blob_id(allocation_id: str, attempt: int, sha256: str) -> str:
    return f"uploads/{allocation_id}/{attempt}/{sha256}"


def _sha_of(blob: str) -> str:
    """An uploaded blob's sha256: the last part of its id (``blob_id``)."""
    return blob.rsplit("/", 1)[-1]


@dataclass
class _Partial:
    """An upload in progress: its node, its scratch file, how much arrived, the hash so far."""

    node: str
    path: Path
    size: int = 0
    sha: Any = field(default_factory=hashlib.sha256)
    touched: float = 0.0

    def drop(self) -> None:
        self.path.unlink(missing_ok=True)


class Uploads:
    def __init__(
        self,
        blobs: BlobStore,
        clock: Clock,
        *,
        max_bytes: int,
        idle_s: float,
        per_node: int = 8,
        total: int = 1024,
    ) -> None:
        self._blobs = blobs
        self._clock = clock
        self._max = max_bytes
        self._idle_s = idle_s
        self._per_node = per_node
        self._total = total
        self._partial: dict[Key, _Partial] = {}
        blobs.clear_scratch(idle_s)  # what a restart cut off: those uploads start over

    async def receive(self, chunks: AsyncIterator[pb.BlobChunk], who: Uploader) -> pb.BlobAck:
        """Take one call's chunks (all of one upload); answer with the blob id, or with how
        much arrived so far."""
        self._forget_idle()
        chunk = await anext(chunks, None)
        if chunk is None:
            return pb.BlobAck()
        key = (chunk.allocation_id, chunk.attempt, chunk.name)
        early = await self._admit(chunk, who)
        if early is not None:
            return early
        part = self._partial.get(key) or self._start(key, who.node)
        while chunk is not None:
            if (chunk.allocation_id, chunk.attempt, chunk.name) != key or chunk.offset < 0:
                raise UploadError(
                    "INVALID_ARGUMENT", f"a call uploads one blob ({key}) at offsets >= 0"
                )
            if self._partial.get(key) is not part:  # dropped meanwhile (too big, idle)
                raise UploadError("ABORTED", f"upload {key} was dropped; start it again")
            part.touched = self._clock.now()
            if chunk.offset > part.size:
                return pb.BlobAck(received=part.size)  # a gap: send again from here
            self._append(key, part, chunk)
            if chunk.last:
                return await self._complete(key, part, chunk.sha256)
            chunk = await anext(chunks, None)
        return pb.BlobAck(received=part.size)

    async def _admit(self, first: pb.BlobChunk, who: Uploader) -> pb.BlobAck | None:
        """Refuse an upload the caller is not entitled to, before anything is opened; answer
        at once what needs no bytes (already stored; how much arrived, to a probe)."""
        _validate(first)
        a, n = first.allocation_id, first.attempt
        if not who.node:
            raise UploadError(
                "PERMISSION_DENIED",
                "an upload must name its node (call metadata corral-node-bin and "
                "corral-node-key): this agent is older than the server; upgrade it",
            )
        standing = await who.standing(a, n)
        if standing is Standing.FOREIGN:
            raise UploadError(
                "PERMISSION_DENIED",
                f"allocation {a} attempt {n} is not work of node {who.node!r} (no such "
                "allocation, another node's or attempt, or the node key does not match)",
            )
        if first.sha256 and self._has(done := blob_id(a, n, first.sha256)):
            return pb.BlobAck(blob_id=done)
        part = self._partial.get((a, n, first.name))
        if not first.data and not first.last:  # a probe: resume from here
            return pb.BlobAck(received=part.size if part else 0)
        if standing is not Standing.LIVE:
            raise UploadError(
                "PERMISSION_DENIED", f"allocation {a} attempt {n} has ended: it takes no uploads"
            )
        return None

    def chunks(self, request: pb.BlobRequest, size: int) -> Iterator[pb.BlobChunk]:
        """An uploaded blob from ``request.offset`` in chunks of ``size``, each read from its
        file as it is sent (the file is open only while a chunk is read); every chunk names
        the blob's sha256 (the last part of its id)."""
        blob = request.blob_id
        path = self._blobs.path(blob) if blob.startswith(("uploads/", "inputs/")) else None
        if path is None or ".." in blob:
            raise UploadError("NOT_FOUND", f"blob {blob} was never uploaded")
        sha = _sha_of(blob)
        total = path.stat().st_size
        offset = min(max(0, request.offset), total)
        while True:
            try:
                data = _read_at(path, offset, size)
            except FileNotFoundError:  # replaced by a newer checkpoint meanwhile
                raise UploadError("NOT_FOUND", f"blob {blob} was deleted") from None
            yield pb.BlobChunk(
                allocation_id=request.allocation_id,
                attempt=request.attempt,
                name=blob,
                offset=offset,
                data=data,
                last=offset + len(data) >= total,
                sha256=sha,
            )
            offset += len(data)
            if offset >= total or not data:
                return

    def owns(self, allocation_id: str, attempt: int, blob: str) -> bool:
        """Whether ``blob`` is an upload of this allocation and attempt."""
        return blob.startswith(blob_id(allocation_id, attempt, "")) and ".." not in blob

    def stored_for(self, allocation_id: str, attempt: int, blob: str) -> StoredBlob:
        """``blob`` as stored (its size; its sha256 is its name), if it was uploaded for this
        allocation and attempt: a large result is linked from it, never read into memory."""
        if not self.owns(allocation_id, attempt, blob):
            raise UploadError(
                "PERMISSION_DENIED", f"blob {blob} does not belong to {allocation_id}"
            )
        path = self._blobs.path(blob)
        try:
            size = path.stat().st_size if path is not None else -1
        except FileNotFoundError:
            size = -1
        if size < 0:
            raise UploadError("NOT_FOUND", f"blob {blob} was never uploaded")
        return StoredBlob(blob, size, _sha_of(blob))

    def _start(self, key: Key, node: str) -> _Partial:
        """A new partial upload for ``node``, within the caps (its file starts empty)."""
        self._within_caps(node)
        name = hashlib.sha256(repr(key).encode()).hexdigest()  # any name the sender chose
        path = self._blobs.scratch(f"{key[0]}-{key[1]}-{name}")
        path.write_bytes(b"")
        part = self._partial[key] = _Partial(node, path, touched=self._clock.now())
        return part

    def _within_caps(self, node: str) -> None:
        """Refuse a new upload past ``agents.max_uploads_per_node`` or ``agents.max_uploads``;
        the refusal says when the oldest one in the way idles out."""
        mine = [p for p in self._partial.values() if p.node == node]
        if len(mine) >= self._per_node:
            raise self._full(
                mine,
                f"node {node!r} has {len(mine)} unfinished uploads, the limit "
                "(agents.max_uploads_per_node)",
            )
        if len(self._partial) >= self._total:
            raise self._full(
                list(self._partial.values()),
                f"the server has {len(self._partial)} unfinished uploads, the limit "
                "(agents.max_uploads)",
            )

    def _full(self, held: list[_Partial], what: str) -> UploadError:
        frees = min(p.touched for p in held) + self._idle_s - self._clock.now()
        return UploadError(
            "RESOURCE_EXHAUSTED",
            f"{what}: finish one, or wait until one idles out (agents.upload_idle_s)",
            retry_after_s=max(1.0, frees),
        )

    def _append(self, key: Key, part: _Partial, chunk: pb.BlobChunk) -> None:
        """Add the chunk's new bytes to the scratch file (opened for this chunk alone)."""
        skip = part.size - chunk.offset  # bytes of this chunk already received
        if skip >= len(chunk.data):
            return
        new = chunk.data[skip:] if skip else chunk.data
        if part.size + len(new) > self._max:
            self._forget(key)
            raise UploadError(
                "RESOURCE_EXHAUSTED",
                f"blob {chunk.name} is larger than the limit of {self._max} bytes "
                "(agents.max_blob_bytes)",
            )
        with part.path.open("ab") as f:
            f.write(new)
        part.sha.update(new)
        part.size += len(new)

    async def _complete(self, key: Key, part: _Partial, want: str) -> pb.BlobAck:
        del self._partial[key]
        sha = part.sha.hexdigest()
        if want and want != sha:
            part.path.unlink(missing_ok=True)
            raise UploadError(
                "DATA_LOSS", f"blob {key[2]}: sha256 {sha} does not match the sender's {want}"
            )
        done = blob_id(key[0], key[1], sha)
        if self._has(done):
            part.path.unlink(missing_ok=True)
        else:
            await self._blobs.put_file(done, part.path)
        return pb.BlobAck(blob_id=done, received=part.size)

    def close(self) -> None:
        """Drop every upload in progress (the server stops: their senders start over)."""
        for key in list(self._partial):
            self._forget(key)

    def _forget(self, key: Key) -> None:
        part = self._partial.pop(key, None)
        if part is not None:
            part.drop()

    def _has(self, blob: str) -> bool:
        """Stored already, as the store says now (a replaced checkpoint is deleted from it:
        the same bytes uploaded again are stored again)."""
        return self._blobs.path(blob) is not None

    def _forget_idle(self) -> None:
        cutoff = self._clock.now() - self._idle_s
        for key in [k for k, v in self._partial.items() if v.touched < cutoff]:
            self._forget(key)


class Releases:
    """Uploads of results the server took (or refused for good), deleted a while later.

    Once linked under ``results/`` an upload is no use. It goes ``delay_s`` (the
    upload idle time) later, so an update resent meanwhile (its ack was lost) still
    finds it and is answered ``duplicate``; the corral agent uploads again before it
    resends anyway.
    """

    def __init__(
        self, delay_s: float, release: Callable[[str, Sequence[str]], Awaitable[None]]
    ) -> None:
        self._delay_s = delay_s
        self._release = release  # ``AgentInbound.uploads_read``
        self._due: set[asyncio.TimerHandle] = set()  # deletions not yet due
        self._running: set[asyncio.Task[None]] = set()

    def later(self, allocation_id: str, blob_ids: list[str]) -> None:
        """Delete ``allocation_id``'s uploads ``blob_ids`` in ``delay_s``."""
        if not blob_ids:
            return

        def due() -> None:
            self._due.discard(handle)
            task = asyncio.ensure_future(self._delete(allocation_id, blob_ids))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

        handle = asyncio.get_running_loop().call_later(self._delay_s, due)
        self._due.add(handle)

    def close(self) -> None:
        """Forget the deletions not yet due (the server stops; those uploads stay)."""
        for handle in self._due:
            handle.cancel()
        self._due.clear()

    async def _delete(self, allocation_id: str, blob_ids: list[str]) -> None:
        try:
            await self._release(allocation_id, blob_ids)
        except Exception:  # the files stay: disk, not correctness
            log.warning("could not delete the uploads of %s", allocation_id, exc_info=True)


def _validate(chunk: pb.BlobChunk) -> None:
    if not chunk.allocation_id or not chunk.name:
        raise UploadError("INVALID_ARGUMENT", "a blob chunk needs allocation_id and name")
    if len(chunk.name) > MAX_NAME:
        raise UploadError("INVALID_ARGUMENT", f"name is longer than {MAX_NAME} characters")
    if chunk.offset < 0:
        raise UploadError("INVALID_ARGUMENT", f"offset must be >= 0, got {chunk.offset}")
    if chunk.sha256 and (len(chunk.sha256) != 64 or not _is_hex(chunk.sha256)):
        raise UploadError("INVALID_ARGUMENT", "sha256 must be 64 hex digits")
    if not chunk.allocation_id.replace("_", "").replace("-", "").isalnum():
        raise UploadError("INVALID_ARGUMENT", f"not an allocation id: {chunk.allocation_id!r}")


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(size)
