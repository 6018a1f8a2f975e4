"""Model files the server holds: uploads in progress and finished ones, on local disk.

An upload through the API arrives in chunks (``Content-Range``) and may be
cut off at any point; the bytes received so far stay in
``<dir>/uploads/<sha256>.part`` (the file's length *is* the progress), so a
client resumes by asking how much arrived and sending the rest. When the last
byte is in, the file is hashed (in a worker thread), compared with the
registry's sha256, synced and renamed to ``<dir>/files/<sha256>``; a mismatch
deletes it. Files are content-addressed, so two names for the same bytes
share one file and a re-registration with the same sha256 keeps its upload.

Files are written and hashed in worker threads: a multi-GB model never blocks
the event loop. Several server replicas need this directory on shared storage.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from corral.core.errors import Conflict, InvalidSpec

HASH_BLOCK = 1024 * 1024


class ModelFiles:
    """Uploaded model files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, asyncio.Lock] = {}

    def file_path(self, sha256: str) -> Path:
        return self.root / "files" / sha256

    def part_path(self, sha256: str) -> Path:
        return self.root / "uploads" / f"{sha256}.part"

    def has(self, sha256: str) -> bool:
        return self.file_path(sha256).is_file()

    def received(self, sha256: str) -> int:
        """Bytes of an unfinished upload on disk (the whole size once it is finished)."""
        done = self.file_path(sha256)
        if done.is_file():
            return done.stat().st_size
        part = self.part_path(sha256)
        return part.stat().st_size if part.is_file() else 0

    def lock(self, sha256: str) -> asyncio.Lock:
        """One writer per file at a time (parallel chunks of one upload are serialised)."""
        return self._locks.setdefault(sha256, asyncio.Lock())

    async def write(self, sha256: str, size: int, start: int, data: bytes) -> int:
        """Write ``data`` at ``start``; returns the bytes now received.

        ``start`` may repeat bytes already received (a retried chunk is
        rewritten), but may not leave a gap: that is a ``Conflict`` naming
        where to go on from.
        """
        received = self.received(sha256)
        if start > received:
            raise Conflict(f"upload has {received} bytes: send the chunk starting at {received}")
        if start + len(data) > size:
            raise InvalidSpec(
                "Content-Range", f"the chunk ends past the model's size ({size} bytes)"
            )
        return await asyncio.to_thread(_write_at, self.part_path(sha256), start, data)

    async def finish(self, sha256: str) -> Path:
        """Check the complete upload's sha256 and move it into place; a mismatch deletes it."""
        part = self.part_path(sha256)
        actual = await asyncio.to_thread(file_sha256, part)
        if actual != sha256:
            part.unlink(missing_ok=True)
            raise InvalidSpec(
                "sha256",
                f"the uploaded bytes hash to {actual}, not the registered {sha256}: "
                "the upload was discarded, send it again",
            )
        target = self.file_path(sha256)
        await asyncio.to_thread(_move_synced, part, target)
        return target

    def delete(self, sha256: str) -> None:
        """Drop the file and any partial upload of these bytes."""
        self.file_path(sha256).unlink(missing_ok=True)
        self.part_path(sha256).unlink(missing_ok=True)


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in blocks (call it in a thread)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_at(path: Path, start: int, data: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("r+b" if path.exists() else "wb") as f:
        f.truncate(start)  # a retried chunk replaces what followed it
        f.seek(start)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def _move_synced(part: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
