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

Partial uploads are assembled in a scratch file beside the blob store's
files (``BlobStore.scratch``; never in memory, so a checkpoint of hundreds
of MiB costs the server disk, not RAM), hashed as their bytes arrive,
bounded by ``max_bytes`` each, and moved into place when complete; one with
no chunk for ``idle_s`` is forgotten and its file deleted. ``FetchBlob``
streams a blob from its file the same way (``chunks``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from corral.core.clock import Clock
from corral.core.errors import CorralError
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.server.blobs import BlobStore, StoredBlob


class UploadError(CorralError):
    """A refused upload; ``code`` is the gRPC status name to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def blob_id(allocation_id: str, attempt: int, sha256: str) -> str:
    return f"uploads/{allocation_id}/{attempt}/{sha256}"


def _sha_of(blob: str) -> str:
    """An uploaded blob's sha256: the last part of its id (``blob_id``)."""
    return blob.rsplit("/", 1)[-1]


@dataclass
class _Partial:
    """An upload in progress: its scratch file, how much arrived, the hash so far."""

    path: Path
    file: BinaryIO
    size: int = 0
    sha: Any = field(default_factory=hashlib.sha256)
    touched: float = 0.0

    def drop(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class Uploads:
    def __init__(self, blobs: BlobStore, clock: Clock, *, max_bytes: int, idle_s: float) -> None:
        self._blobs = blobs
        self._clock = clock
        self._max = max_bytes
        self._idle_s = idle_s
        self._partial: dict[tuple[str, int, str], _Partial] = {}
        blobs.clear_scratch(idle_s)  # what a restart cut off: those uploads start over

    async def receive(self, chunks: AsyncIterator[pb.BlobChunk]) -> pb.BlobAck:
        """Take one call's chunks; answer with the blob id, or with how much arrived so far."""
        self._forget_idle()
        part: _Partial | None = None
        first = True
        async for chunk in chunks:
            _validate(chunk)
            key = (chunk.allocation_id, chunk.attempt, chunk.name)
            if first and chunk.sha256:
                done = blob_id(chunk.allocation_id, chunk.attempt, chunk.sha256)
                if self._has(done):
                    return pb.BlobAck(blob_id=done)
            part = self._partial.get(key)
            if first and not chunk.data and not chunk.last:  # a probe: resume from here
                return pb.BlobAck(received=part.size if part else 0)
            first = False
            part = part or self._start(key)
            part.touched = self._clock.now()
            if chunk.offset > part.size:
                return pb.BlobAck(received=part.size)  # a gap: send again from here
            self._append(key, part, chunk)
            if chunk.last:
                return await self._complete(key, part, chunk.sha256)
        return pb.BlobAck(received=part.size if part else 0)

    def chunks(self, request: pb.BlobRequest, size: int) -> Iterator[pb.BlobChunk]:
        """An uploaded blob from ``request.offset`` in chunks of ``size``, read from its file
        as they are sent; every chunk names the blob's sha256 (the last part of its id)."""
        blob = request.blob_id
        path = self._blobs.path(blob) if blob.startswith("uploads/") else None
        if path is None or ".." in blob:
            raise UploadError("NOT_FOUND", f"blob {blob} was never uploaded")
        sha = _sha_of(blob)
        with path.open("rb") as f:
            total = os.fstat(f.fileno()).st_size
            offset = min(max(0, request.offset), total)
            f.seek(offset)
            while True:
                data = f.read(size)
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
                if offset >= total:
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

    def _start(self, key: tuple[str, int, str]) -> _Partial:
        name = hashlib.sha256(repr(key).encode()).hexdigest()  # any name the sender chose
        path = self._blobs.scratch(f"{key[0]}-{key[1]}-{name}")
        part = self._partial[key] = _Partial(path, path.open("wb", buffering=0))
        return part

    def _append(self, key: tuple[str, int, str], part: _Partial, chunk: pb.BlobChunk) -> None:
        skip = part.size - chunk.offset  # bytes of this chunk already received
        if skip >= len(chunk.data):
            return
        new = chunk.data[skip:] if skip else chunk.data
        if part.size + len(new) > self._max:
            self._forget(key)
            raise UploadError(
                "RESOURCE_EXHAUSTED",
                f"blob {chunk.name} is larger than the limit of {self._max} bytes",
            )
        part.file.write(new)
        part.sha.update(new)
        part.size += len(new)

    async def _complete(self, key: tuple[str, int, str], part: _Partial, want: str) -> pb.BlobAck:
        del self._partial[key]
        part.file.close()
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

    def _forget(self, key: tuple[str, int, str]) -> None:
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


def _validate(chunk: pb.BlobChunk) -> None:
    if not chunk.allocation_id or not chunk.name:
        raise UploadError("INVALID_ARGUMENT", "a blob chunk needs allocation_id and name")
    if chunk.offset < 0:
        raise UploadError("INVALID_ARGUMENT", f"offset must be >= 0, got {chunk.offset}")
    if chunk.sha256 and (len(chunk.sha256) != 64 or not _is_hex(chunk.sha256)):
        raise UploadError("INVALID_ARGUMENT", "sha256 must be 64 hex digits")
    if not chunk.allocation_id.replace("_", "").replace("-", "").isalnum():
        raise UploadError("INVALID_ARGUMENT", f"not an allocation id: {chunk.allocation_id!r}")


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
