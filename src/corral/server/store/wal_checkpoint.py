"""SQLite WAL checkpoints on a thread of their own, not inside a commit on the event loop.

SQLite copies the WAL back into the database file (a checkpoint) on the commit
that takes the WAL past ``wal_autocheckpoint`` pages (1,000 by default), inside
that commit: a thousand page writes and two syncs. The server commits inline on
its event loop (``sqlite_inline``), so under load about one job in a hundred
stalled every request, stream and agent for the length of a checkpoint, and
the copies were about two thirds of the pages the server wrote (``strace`` in
the end-to-end benchmark: 19.5 ``pwrite`` calls and 0.03 syncs of the database
per job; docs/performance.md, "Sixth round").

So the server's connections never checkpoint (``PRAGMA wal_autocheckpoint=0``)
and ``Checkpointer`` does it: every ``EVERY_COMMITS`` commits it runs ``PRAGMA
wal_checkpoint(PASSIVE)`` on a connection of its own in a worker thread (SQLite
releases the GIL while it copies and syncs, so the loop serves on, and on a
second core the copy costs the loop nothing). A passive checkpoint waits for
no reader or writer: it copies the frames it can. But the WAL starts over from
its beginning only when a writer finds all of it copied, and writers go on
while a checkpoint runs; so when ``RESET_AFTER`` checkpoints in a row saw the
WAL longer than the one before (it did not start over), the next one holds
writers back (the ``Database`` write lock, as SQLite's own checkpoint held the
commit): the WAL is copied whole, the next commit starts it over, and it stays
bounded.
When the server stops, the last connection to close checkpoints the rest
(SQLite does that itself).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

log = logging.getLogger("corral.server.store")

EVERY_COMMITS: Final = 200
"""Commits between checkpoints: a few hundred to a thousand WAL pages at a job's 3-6."""
RESET_AFTER: Final = 4
"""Checkpoints in a row that found the WAL not started over before one holds writers back."""


class Checkpointer:
    def __init__(self, database: Path, writers: asyncio.Lock) -> None:
        self.database = database
        self._writers = writers
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-checkpoint")
        self._conn: sqlite3.Connection | None = None  # used on the thread only
        self._commits = 0
        self._behind = 0  # checkpoints in a row that found the WAL longer than the last one
        self._frames = 0  # the WAL's length (frames) at the last checkpoint
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.checkpoints = 0  # done so far (for tests and metrics)
        self.held = 0  # of which held writers back
        self.longest = 0  # the longest WAL a checkpoint found (frames)

    def committed(self) -> None:
        """Call after every commit: start a checkpoint every ``EVERY_COMMITS`` (one at a time)."""
        self._commits += 1
        if self._commits < EVERY_COMMITS or (self._task is not None and not self._task.done()):
            return
        if self._closed:
            return
        self._commits = 0
        self._task = asyncio.get_running_loop().create_task(self._checkpoint())

    async def close(self) -> None:
        """Wait for a checkpoint under way, then let the thread and its connection go
        (again: nothing more to do)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._disconnect)
        self._thread.shutdown(wait=True)

    async def _checkpoint(self) -> None:
        loop = asyncio.get_running_loop()
        hold = self._behind >= RESET_AFTER  # the WAL keeps growing: copy it whole this time
        try:
            if hold:
                async with self._writers:
                    frames = await loop.run_in_executor(self._thread, self._passive)
            else:
                frames = await loop.run_in_executor(self._thread, self._passive)
        except sqlite3.Error as exc:  # the next one tries again; SQLite's data is unharmed
            log.warning("WAL checkpoint of %s failed: %s", self.database, exc)
            return
        self.checkpoints += 1
        self.held += hold
        self.longest = max(self.longest, frames)
        self._behind = 0 if hold or frames < self._frames else self._behind + 1
        self._frames = frames

    def _passive(self) -> int:
        """One passive checkpoint (on the thread); the WAL's length in frames."""
        if self._conn is None:
            self._conn = sqlite3.connect(self.database, timeout=30.0, check_same_thread=False)
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
        _busy, frames, _copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return max(0, int(frames))

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
