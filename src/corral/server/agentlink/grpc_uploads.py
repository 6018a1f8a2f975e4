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
  (``read_for``): an agent cannot pass off another job's bytes as its own.

Partial uploads live in memory (bounded by ``max_bytes`` each) and are
forgotten after ``idle_s`` without a chunk.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from corral.core.clock import Clock
from corral.core.errors import CorralError, NotFound
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.server.blobs import BlobStore


class UploadError(CorralError):
    """A refused upload; ``code`` is the gRPC status name to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def blob_id(allocation_id: str, attempt: int, sha256: str) -> str:
    return f"uploads/{allocation_id}/{attempt}/{sha256}"


@dataclass
class _Partial:
    data: bytearray = field(default_factory=bytearray)
    touched: float = 0.0


class Uploads:
    def __init__(self, blobs: BlobStore, clock: Clock, *, max_bytes: int, idle_s: float) -> None:
        self._blobs = blobs
        self._clock = clock
        self._max = max_bytes
        self._idle_s = idle_s
        self._partial: dict[tuple[str, int, str], _Partial] = {}

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
            part = self._partial.setdefault(key, _Partial())
            part.touched = self._clock.now()
            if first and not chunk.data and not chunk.last:
                return pb.BlobAck(received=len(part.data))  # a probe: resume from here
            first = False
            if chunk.offset > len(part.data):
                return pb.BlobAck(received=len(part.data))  # a gap: send again from here
            self._append(part, chunk)
            if chunk.last:
                return await self._complete(key, part, chunk.sha256)
        return pb.BlobAck(received=len(part.data) if part else 0)

    async def read(self, blob: str) -> bytes:
        """The bytes of an uploaded blob (the caller checked who may read it)."""
        if not blob.startswith("uploads/") or ".." in blob:
            raise UploadError("INVALID_ARGUMENT", f"not an uploaded blob: {blob!r}")
        try:
            return await self._blobs.get(blob)
        except NotFound:
            raise UploadError("NOT_FOUND", f"blob {blob} was never uploaded") from None

    def owns(self, allocation_id: str, attempt: int, blob: str) -> bool:
        """Whether ``blob`` is an upload of this allocation and attempt."""
        return blob.startswith(blob_id(allocation_id, attempt, "")) and ".." not in blob

    async def read_for(self, allocation_id: str, attempt: int, blob: str) -> bytes:
        """The bytes of ``blob``, if it was uploaded for this allocation and attempt."""
        if not self.owns(allocation_id, attempt, blob):
            raise UploadError(
                "PERMISSION_DENIED", f"blob {blob} does not belong to {allocation_id}"
            )
        try:
            return await self._blobs.get(blob)
        except NotFound:
            raise UploadError("NOT_FOUND", f"blob {blob} was never uploaded") from None

    def _append(self, part: _Partial, chunk: pb.BlobChunk) -> None:
        skip = len(part.data) - chunk.offset  # bytes of this chunk already received
        if skip < len(chunk.data):
            part.data += chunk.data[skip:]
        if len(part.data) > self._max:
            self._partial = {k: v for k, v in self._partial.items() if v is not part}
            raise UploadError(
                "RESOURCE_EXHAUSTED",
                f"blob {chunk.name} is larger than the limit of {self._max} bytes",
            )

    async def _complete(self, key: tuple[str, int, str], part: _Partial, want: str) -> pb.BlobAck:
        data = bytes(part.data)
        self._partial.pop(key, None)
        sha = hashlib.sha256(data).hexdigest()
        if want and want != sha:
            raise UploadError(
                "DATA_LOSS", f"blob {key[2]}: sha256 {sha} does not match the sender's {want}"
            )
        done = blob_id(key[0], key[1], sha)
        if not self._has(done):
            await self._blobs.put(done, data)
        return pb.BlobAck(blob_id=done, received=len(data))

    def _has(self, blob: str) -> bool:
        """Stored already, as the store says now (a replaced checkpoint is deleted from it:
        the same bytes uploaded again are stored again)."""
        return self._blobs.path(blob) is not None

    def _forget_idle(self) -> None:
        cutoff = self._clock.now() - self._idle_s
        self._partial = {k: v for k, v in self._partial.items() if v.touched >= cutoff}


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
