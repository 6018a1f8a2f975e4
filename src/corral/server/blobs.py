"""The blob store seam: result files, preview images and uploaded checkpoints.

``LocalBlobStore`` keeps them under one directory. A blob is written to a
temporary file, flushed to disk and renamed into place, so a reader never
sees half a file and a crash leaves at most an orphan temp file. Blobs are
written before the database row that refers to them is committed: an
accepted result therefore always has its bytes on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from corral.core.errors import InvalidSpec, NotFound

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


@dataclass(frozen=True, slots=True)
class StoredBlob:
    key: str
    size: int
    sha256: str


class BlobStore(Protocol):
    """Where bytes live. Keys are ``/``-separated safe names (no ``..``)."""

    async def put(self, key: str, data: bytes) -> StoredBlob: ...

    async def get(self, key: str) -> bytes: ...

    def path(self, key: str) -> Path | None:
        """A local file for ``key`` (to stream it), or None when the store is remote."""
        ...

    async def delete(self, key: str) -> bool:
        """Remove ``key``; False when there was nothing to remove."""
        ...

    def scratch(self, name: str) -> Path:
        """A file to assemble a blob in (an upload in progress), beside the store's files."""
        ...

    async def put_file(self, key: str, source: Path) -> None:
        """Move the finished ``scratch`` file ``source`` into place as ``key``, durably."""
        ...

    async def link(self, source: StoredBlob, key: str) -> StoredBlob:
        """Store the bytes of blob ``source`` as ``key`` too, without reading them into
        memory (a hard link where the store can, else a copy); NotFound if it is gone."""
        ...

    def clear_scratch(self, idle_s: float) -> int:
        """Delete scratch files untouched for ``idle_s``; how many."""
        ...

    async def keys(self, prefix: str) -> list[str]:
        """The keys directly under folder ``prefix``, oldest first (by when written)."""
        ...

    async def folders(self, prefix: str) -> list[str]:
        """The names of the folders directly under folder ``prefix``."""
        ...

    async def delete_tree(self, prefix: str) -> int:
        """Remove folder ``prefix`` and every blob under it; how many blobs."""
        ...


def check_key(key: str) -> str:
    """Refuse keys that could escape the store (``..``, absolute paths, odd characters)."""
    if not _KEY.match(key) or ".." in key.split("/"):
        raise InvalidSpec("name", f"not a safe blob name: {key!r}")
    return key


class LocalBlobStore:
    """Blobs as files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def put(self, key: str, data: bytes) -> StoredBlob:
        path = self.root / check_key(key)
        await asyncio.to_thread(_write_atomically, path, data)
        return StoredBlob(key, len(data), hashlib.sha256(data).hexdigest())

    async def get(self, key: str) -> bytes:
        path = self.root / check_key(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise NotFound(f"blob {key} not found") from None

    def path(self, key: str) -> Path | None:
        path = self.root / check_key(key)
        return path if path.is_file() else None

    async def delete(self, key: str) -> bool:
        return await asyncio.to_thread(_remove, self.root, self.root / check_key(key))

    def scratch(self, name: str) -> Path:
        path = self.root / SCRATCH / check_key(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    async def put_file(self, key: str, source: Path) -> None:
        await asyncio.to_thread(_move_durably, source, self.root / check_key(key))

    async def link(self, source: StoredBlob, key: str) -> StoredBlob:
        src, dst = self.root / check_key(source.key), self.root / check_key(key)
        try:
            await asyncio.to_thread(_link_or_copy, src, dst)
        except FileNotFoundError:
            raise NotFound(f"blob {source.key} not found") from None
        return StoredBlob(key, source.size, source.sha256)

    def clear_scratch(self, idle_s: float) -> int:
        """Delete scratch files untouched for ``idle_s`` (uploads a restart cut off start
        over; a replica sharing the folder keeps the ones it is still writing)."""
        cutoff, removed = time.time() - idle_s, 0
        for path in (self.root / SCRATCH).glob("*"):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed

    async def keys(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(_keys, self.root / check_key(prefix), prefix)

    async def folders(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(_folders, self.root / check_key(prefix))

    async def delete_tree(self, prefix: str) -> int:
        return await asyncio.to_thread(_remove_tree, self.root, self.root / check_key(prefix))


SCRATCH = ".partial"  # not a valid key (keys start with a letter or digit): never served


def _move_durably(source: Path, path: Path) -> None:
    with source.open("rb") as f:
        os.fsync(f.fileno())
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, path)


def _link_or_copy(source: Path, path: Path) -> None:
    """``path`` holds ``source``'s bytes: a hard link (no copy, no read), or where links are
    not possible (another file system), a copy written and flushed like ``put``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{secrets.token_hex(8)}")  # never a key: keys start alnum
    try:
        try:
            os.link(source, tmp)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            shutil.copyfile(source, tmp)
            with tmp.open("rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _remove(root: Path, path: Path) -> bool:
    """Unlink ``path``, then its folders up to ``root`` that it leaves empty."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _prune(root, path.parent)
    return True


def _prune(root: Path, folder: Path) -> None:
    """Remove ``folder`` and its parents below ``root`` while they are empty."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()  # only if empty: a blob written there meanwhile keeps it
        except OSError:
            break
        folder = folder.parent


def _keys(folder: Path, prefix: str) -> list[str]:
    """Blobs in ``folder`` (not temp files, not subfolders), oldest first, then by name."""
    found = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(folder):
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                found.append((entry.stat().st_mtime_ns, entry.name))
    return [f"{prefix}/{name}" for _, name in sorted(found)]


def _folders(folder: Path) -> list[str]:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return sorted(e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False))
    return []


def _remove_tree(root: Path, folder: Path) -> int:
    """Unlink every file under ``folder``, then the folders it leaves empty up to ``root``."""
    removed = 0
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(dirpath, name))
                removed += 0 if name.startswith(".") else 1
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
    _prune(root, folder.parent)
    return removed


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
