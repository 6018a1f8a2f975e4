"""Blobs over the link: chunked, resumable uploads (results, checkpoints) and downloads.

Uploads go through ``UploadBlob``: a probe (an empty chunk with the SHA-256)
asks the server what it already has, then the rest is sent from there, so a
cut-off upload resumes and a repeated one stores nothing twice (see the
server's ``grpc_uploads``). Downloads go through ``FetchBlob`` from an
offset, so a cut-off download resumes too; the SHA-256 every chunk carries
is checked at the end.

Checkpoints are files or directories: they travel as one tar archive whose
single top entry is the checkpoint's own name, and are unpacked with
tarfile's ``data`` filter (no absolute paths, no links out, no devices). The
archive is a file, written, uploaded and downloaded a chunk at a time: a
checkpoint of hundreds of MiB costs the agent disk while it travels, not RAM.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
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
READ_BYTES = 1 << 20  # hashing a file reads it this much at a time


class FetchRefused(LinkError):
    """The server will never hand this blob over (not found, not this allocation's)."""


async def upload(
    stub: Any,
    metadata: Sequence[tuple[str, str | bytes]],
    chunk: pb.BlobChunk,
    source: bytes | Path,
    chunk_bytes: int,
    known: tuple[int, str] | None = None,
) -> str:
    """Upload ``source`` (bytes, or a file read a chunk at a time: a checkpoint archive is
    never held in memory) as described by ``chunk`` (allocation, attempt, name, mime); its
    blob id. ``known``: its (size, sha256), when the caller has them."""
    size, sha = known or await size_and_sha(source)
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
        for offset, piece in _pieces(source, start, size, chunk_bytes):
            part = pb.BlobChunk()
            part.CopyFrom(base)
            part.offset, part.data, part.last = offset, piece, offset + chunk_bytes >= size
            yield part

    ack = await stub.UploadBlob(chunks(None), metadata=metadata)
    for _ in range(3):
        if ack.blob_id:
            return str(ack.blob_id)
        ack = await stub.UploadBlob(chunks(ack.received), metadata=metadata)
    raise LinkError(f"upload of {chunk.name} did not complete")


def _pieces(
    source: bytes | Path, start: int, size: int, chunk_bytes: int
) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` from ``start`` on, at least one piece (an empty blob is one)."""
    if isinstance(source, bytes):
        for offset in range(start, max(size, 1), chunk_bytes):
            yield offset, source[offset : offset + chunk_bytes]
        return
    with source.open("rb") as f:
        f.seek(start)
        for offset in range(start, max(size, 1), chunk_bytes):
            yield offset, f.read(chunk_bytes)


async def size_and_sha(source: bytes | Path) -> tuple[int, str]:
    """The size and sha256 of bytes, or of a file (read in a thread)."""
    if isinstance(source, bytes):
        return len(source), hashlib.sha256(source).hexdigest()
    return await asyncio.to_thread(_size_and_sha, source)


def _size_and_sha(path: Path) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while piece := f.read(READ_BYTES):
            sha.update(piece)
            size += len(piece)
    return size, sha.hexdigest()


async def fetch(
    stub: Any, metadata: Sequence[tuple[str, str | bytes]], request: pb.BlobRequest, into: Path
) -> Path:
    """Download a blob into the file ``into`` (hashed as it arrives, never held in memory),
    resuming after a cut-off; raises ``LinkError`` if it cannot finish or does not match."""
    into.parent.mkdir(parents=True, exist_ok=True)
    sha, want, tries = hashlib.sha256(), "", 0
    with into.open("wb") as out:
        while True:
            ask = pb.BlobRequest()
            ask.CopyFrom(request)
            ask.offset = out.tell()
            try:
                async for part in stub.FetchBlob(ask, metadata=metadata):
                    if part.offset == out.tell():
                        out.write(part.data)
                        sha.update(part.data)
                    want = part.sha256 or want
                    if part.last:
                        if want and sha.hexdigest() != want:
                            raise LinkError(
                                f"{request.blob_id}: the downloaded bytes do not match their sha256"
                            )
                        return into
                raise LinkError(f"the download of {request.blob_id} ended early")
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND):
                    raise FetchRefused(f"{request.blob_id}: {exc.details()}") from None
                tries += 1
                if tries >= FETCH_TRIES:
                    raise LinkError(f"the download of {request.blob_id} kept breaking") from None


def pack(path: Path, archive: Path) -> Path:
    """A file or directory as the tar file ``archive`` with one top entry: ``path.name``."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="w") as tar:
        tar.add(path, arcname=path.name)
    return archive


def unpack(archive: Path, into: Path) -> Path:
    """Unpack ``pack``'s archive into ``into`` (emptied first); the path of its top entry."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    with tarfile.open(archive, mode="r") as tar:
        tops = {Path(m.name).parts[0] for m in tar.getmembers() if m.name}
        if len(tops) != 1:
            raise LinkError(f"a checkpoint archive must hold one entry, it holds {len(tops)}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            extract_data(tar, into)
    return into / tops.pop()


def extract_data(tar: tarfile.TarFile, into: Path) -> None:
    """``tar.extractall(into, filter="data")`` for a Python without extraction filters
    (before 3.11.4, as Debian 12's 3.11.2): files, directories and links that stay inside
    ``into``, written with plain permissions and the user's ownership; anything else is
    refused before it is written."""
    root = into.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if os.path.isabs(member.name) or not target.is_relative_to(root):
            raise LinkError(f"a checkpoint archive's entry leaves its directory: {member.name!r}")
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if member.isfile():
            source = tar.extractfile(member)
            assert source is not None  # a regular file's member has data
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
            os.chmod(target, 0o755 if member.mode & 0o100 else 0o644)
        elif member.issym() or member.islnk():
            base = target.parent if member.issym() else root
            linked = (base / member.linkname).resolve()
            if os.path.isabs(member.linkname) or not linked.is_relative_to(root):
                raise LinkError(
                    f"a checkpoint archive's link leaves its directory: {member.name!r} -> "
                    f"{member.linkname!r}"
                )
            if member.issym():
                os.symlink(member.linkname, target)
            else:
                shutil.copyfile(linked, target)
        else:
            raise LinkError(
                f"a checkpoint archive may hold files, directories and links, not "
                f"{member.name!r} (a device or a pipe)"
            )


def size_of(path: Path) -> int:
    """Bytes in a file, or in every file under a directory."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
