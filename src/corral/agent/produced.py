"""Result files this agent made, kept by sha256 so a later step on the same machine reads
them without any transfer (docs/server.md, "Pipelines and job arrays").

When a result is uploaded as a blob (too large to ride inline), the file is hard-linked
here under its sha256 (written, for a result held in memory). A pipeline's next step
names it as an input file by that sha256; ``InputCourier`` looks here before it asks
the server, and a hit is a hard link again: no bytes cross the network or the disk.
Inline results are small enough that fetching them costs nothing worth keeping.

Bounded: at most ``max_files`` files and ``max_bytes`` bytes, the least recently made
or used go first. A cache miss (evicted, another machine made it) is an ordinary fetch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from pathlib import Path

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 64
MAX_BYTES = 8 * 2**30
"""Room for a few dozen full-size images or a handful of latents and checkpoints of a
pipeline's steps: the next step usually runs within seconds of the one before."""


class ProducedFiles:
    def __init__(self, root: Path, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> None:
        self.root = root
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.reused = 0  # inputs taken from here instead of fetched

    async def keep(self, sha: str, source: Path | bytes) -> None:
        """Keep a result just uploaded (a hard link of its file, or its bytes)."""
        if not SHA256.match(sha):
            return
        await asyncio.to_thread(self._keep, sha, source)

    def _keep(self, sha: str, source: Path | bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.root / sha
        if target.exists():
            os.utime(target)
            return
        scratch = self.root / f".{sha}.part"
        try:
            if isinstance(source, bytes):
                scratch.write_bytes(source)
            else:
                _link_or_copy(source, scratch)
            scratch.replace(target)
        except OSError:  # a full disk or a vanished file: the next step fetches it instead
            scratch.unlink(missing_ok=True)
            return
        self._trim()

    async def take(self, sha: str, into: Path) -> Path | None:
        """``into`` holding the file of ``sha`` when this machine made it (a hard link);
        None when it is not here."""
        if not SHA256.match(sha):
            return None
        found = await asyncio.to_thread(self._take, sha, into)
        if found is not None:
            self.reused += 1
        return found

    def _take(self, sha: str, into: Path) -> Path | None:
        held = self.root / sha
        if not held.is_file():
            return None
        into.parent.mkdir(parents=True, exist_ok=True)
        try:
            _link_or_copy(held, into)
            os.utime(held)  # recently used: kept longer
        except OSError:
            return None
        return into

    def _trim(self) -> None:
        """Drop the least recently used files past the bounds."""
        files = []
        for path in self.root.iterdir():
            if SHA256.match(path.name):
                with contextlib.suppress(OSError):
                    st = path.stat()
                    files.append((st.st_mtime, st.st_size, path))
        files.sort(reverse=True)  # newest first
        count = total = 0
        for _, size, path in files:
            if count < self.max_files and total + size <= self.max_bytes:
                count, total = count + 1, total + size
            else:
                path.unlink(missing_ok=True)


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link (no bytes copied); a copy across file systems."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
