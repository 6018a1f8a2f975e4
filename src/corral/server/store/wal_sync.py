"""Group fsync of a SQLite WAL, outside the write lock.

With ``PRAGMA synchronous=FULL`` SQLite fsyncs the WAL inside every commit,
so the one writer holds the write lock for the length of an fsync (about
4 ms on the development machine) and every other writer, durable or not,
queues behind it. SQLite documents FULL in WAL mode as NORMAL plus "an
additional sync operation of the WAL file after each transaction commit".
``WalSync`` is that sync, moved: commits run with NORMAL (written to the
WAL, no fsync), the write lock is released, and a durable writer then waits
here until an fsync of the WAL that started after its commit has finished.
Such an fsync covers every commit before it, so concurrent durable writers
share one, and other writers commit while it runs.

What a durable writer is promised is unchanged: when ``wait`` returns, its
commit is on disk (survives power loss, not only kill -9). What others may
see earlier: a reader can read a committed row before its fsync finished
(a power loss at that moment forgets it, and nobody was told it was
accepted).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from corral.server.store.sqlite_inline import COMMITS


class WalSync:
    def __init__(self, wal: Path) -> None:
        self.wal = wal
        self.committed = 0  # commits made so far (positions)
        self.synced = 0  # every commit up to this position is on disk
        self.syncs = 0  # fsyncs done (for tests and metrics)
        self._running: asyncio.Future[None] | None = None

    def mark(self) -> int:
        """Call right after a commit: its position, to ``wait`` for."""
        self.committed += 1
        return self.committed

    async def wait(self, position: int) -> None:
        """Return once the commit at ``position`` is on disk (start an fsync if none runs)."""
        while self.synced < position:
            if self._running is None or self._running.done():
                self._running = asyncio.ensure_future(self._sync())
            await asyncio.shield(self._running)

    async def _sync(self) -> None:
        covered = self.committed  # commits made before this fsync starts are in the file
        await asyncio.get_running_loop().run_in_executor(COMMITS, _fsync, self.wal)
        self.synced = max(self.synced, covered)
        self.syncs += 1


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # no WAL: the last connection checkpointed it into the (synced) database
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
