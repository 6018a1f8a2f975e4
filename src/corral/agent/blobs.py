"""Blobs over the link: chunked, resumable uploads (results, checkpoints) and downloads.

Uploads go through ``UploadBlob``: a probe (an empty chunk with the SHA-256)
asks the server what it already has, then the rest is sent from there, so a
cut-off upload resumes and a repeated one stores nothing twice (see the
server's ``grpc_uploads``). Downloads go through ``FetchBlob`` from an
offset, so a cut-off download resumes too; the SHA-256 every chunk carries
is checked at the end.

Checkpoints are files or directories: they travel as one tar archive whose
single top entry is the checkpoint's own name, and are unpacked with
tarfile's ``data`` filter (no absolute paths, no links out, no devices).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from corral.core import LinkError
from corral.proto.gen.corral.v1 import agent_pb2 as pb

FETCH_TRIES = 4
"""A download cut off this many times in a row is given up (the attempt starts afresh)."""


class FetchRefused(LinkError):
    """The server will never hand this blob over (not found, not this allocation's)."""


async def upload(
    stub: Any,
    metadata: Sequence[tuple[str, str]],
    chunk: pb.BlobChunk,
    data: bytes,
    chunk_bytes: int,
) -> str:
    """Upload ``data`` as described by ``chunk`` (allocation, attempt, name, mime); its blob id."""
    sha = hashlib.sha256(data).hexdigest()
    base = pb.BlobChunk(
        allocation_id=chunk.allocation_id,
        attempt=chunk.attempt,
        name=chunk.name,
        mime=chunk.mime,
        sha256=sha,
    )

    def chunks(start: int | None) -> Iterator[pb.BlobChunk]:
        if start is None:  # a probe: has the server got it, or how much of it?
            yield base
            return
        for offset in range(start, max(len(data), 1), chunk_bytes):
            piece = data[offset : offset + chunk_bytes]
            last = offset + chunk_bytes >= len(data)
            part = pb.BlobChunk()
            part.CopyFrom(base)
            part.offset, part.data, part.last = offset, piece, last
            yield part

    ack = await stub.UploadBlob(chunks(None), metadata=metadata)
    for _ in range(3):
        if ack.blob_id:
            return str(ack.blob_id)
        ack = await stub.UploadBlob(chunks(ack.received), metadata=metadata)
    raise LinkError(f"upload of {chunk.name} did not complete")


async def fetch(stub: Any, metadata: Sequence[tuple[str, str]], request: pb.BlobRequest) -> bytes:
    """Download a blob, resuming after a cut-off; raises ``LinkError`` if it cannot finish."""
    data, sha, tries = bytearray(), "", 0
    while True:
        ask = pb.BlobRequest()
        ask.CopyFrom(request)
        ask.offset = len(data)
        try:
            async for part in stub.FetchBlob(ask, metadata=metadata):
                if part.offset == len(data):
                    data += part.data
                sha = part.sha256 or sha
                if part.last:
                    return _checked(bytes(data), sha, request.blob_id)
            raise LinkError(f"the download of {request.blob_id} ended early")
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND):
                raise FetchRefused(f"{request.blob_id}: {exc.details()}") from None
            tries += 1
            if tries >= FETCH_TRIES:
                raise LinkError(f"the download of {request.blob_id} kept breaking") from None


def _checked(data: bytes, sha: str, name: str) -> bytes:
    if sha and hashlib.sha256(data).hexdigest() != sha:
        raise LinkError(f"{name}: the downloaded bytes do not match their sha256")
    return data


def pack(path: Path) -> bytes:
    """A file or directory as a tar archive with one top entry: ``path.name``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(path, arcname=path.name)
    return buffer.getvalue()


def unpack(data: bytes, into: Path) -> Path:
    """Unpack ``pack``'s archive into ``into`` (emptied first); the path of its top entry."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
        tops = {Path(m.name).parts[0] for m in archive.getmembers() if m.name}
        if len(tops) != 1:
            raise LinkError(f"a checkpoint archive must hold one entry, it holds {len(tops)}")
        archive.extractall(into, filter="data")
    return into / tops.pop()


def size_of(path: Path) -> int:
    """Bytes in a file, or in every file under a directory."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
