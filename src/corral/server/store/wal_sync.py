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

Where the fsync itself is fast (SSDs with a write cache that honours flushes
take 0.1-0.5 ms), handing it to a thread costs more than it saves: the thread
hop (queue, wake-up, the GIL handed over and back, the loop woken) was 5% of
the server's CPU under load, and on a busy loop the thread waits for the GIL
(up to the interpreter's switch interval, 5 ms) before and after the disk.
So fsyncs run on the loop itself (os.fsync releases the GIL, so the server's
gRPC threads keep going) while the ones timed there average under
``INLINE_BELOW_S``. It was 0.5 ms until a machine whose WAL fsyncs took
0.36 ms (p50; 0.4 mean, bursts above) put them on the thread, where, against
the loop, the idle round trip was 1 ms slower (7.6 against 6.6 ms) and
concurrent throughput 8% lower (334 against 362 jobs/s, 2.31 against 2.06 ms
of server CPU per job; the two builds in turn in one run). Only fsyncs on the
loop are timed: on the thread, the time to get the GIL back would count as
the disk's.
Once one is slow, fsyncs go to the thread, and every ``probe``-th one after
that runs on the loop again to see whether the disk got faster (the interval
doubles each time it did not, up to ``MAX_PROBE_EVERY``): a slow disk stalls
the loop for one fsync in a thousand at most.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Final

from corral.server.store.sqlite_inline import COMMITS

INLINE_BELOW_S: Final = 0.002
"""fsyncs run on the loop while their moving average is below this (seconds)."""
WEIGHT: Final = 0.2  # of the newest fsync in the moving average
FIRST_PROBE_EVERY: Final = 16
MAX_PROBE_EVERY: Final = 1024
PREFILL_CHUNK: Final = 1 << 20  # bytes written at a time by ``prefill``


class WalSync:
    def __init__(self, wal: Path) -> None:
        self.wal = wal
        self.file = WalFile(wal)
        self.committed = 0  # commits made so far (positions)
        self.synced = 0  # every commit up to this position is on disk
        self.syncs = 0  # fsyncs done (for tests and metrics)
        self.inline = 0  # of which on the loop itself
        self.average_s = 0.0  # of the fsyncs timed on the loop
        # fsyncs run on the loop while ``average_s`` is below this; 0: never (on the thread)
        self.inline_below_s = INLINE_BELOW_S
        self.probe_every = FIRST_PROBE_EVERY
        self._until_probe = 0
        self._running: asyncio.Future[None] | None = None

    def mark(self) -> int:
        """Call right after a commit: its position, to ``wait`` for."""
        self.committed += 1
        return self.committed

    def start(self, position: int) -> None:
        """While fsyncs go to the thread, have one under way for the commit at ``position``
        now, so it overlaps whatever the caller wakes next (a scheduling cycle). Fsyncs on
        the loop wait for ``wait``: they would hold that cycle (and the next assignment)
        back instead."""
        if self.average_s >= self.inline_below_s:
            self._syncing(position)

    async def wait(self, position: int) -> None:
        """Return once the commit at ``position`` is on disk (start an fsync if none runs)."""
        while self.synced < position:
            await asyncio.shield(self._syncing(position))

    def _syncing(self, position: int) -> asyncio.Future[None]:
        """The fsync under way, started now unless one runs (or ``position`` is on disk)."""
        if self._running is None or (self._running.done() and self.synced < position):
            self._running = asyncio.ensure_future(self._sync())
        return self._running

    async def _sync(self) -> None:
        covered = self.committed  # commits made before this fsync starts are in the file
        fast = self.average_s < self.inline_below_s
        probe = self._until_probe <= 0 and self.inline_below_s > 0
        if fast or probe:  # on the loop (or a probe: is the disk fast again?)
            # One turn of the loop first: what the commit's wake-ups made ready (a cycle's
            # assignments on their way to agents) goes out before the loop blocks on the disk.
            await asyncio.sleep(0)
            covered = self.committed
            self._timed(self.file.fsync(), probe=not fast)
        else:
            await asyncio.get_running_loop().run_in_executor(COMMITS, self.file.fsync)
            self._until_probe -= 1
        self.synced = max(self.synced, covered)
        self.syncs += 1

    def _timed(self, took: float, *, probe: bool) -> None:
        """Count an fsync done on the loop and decide where the next ones run."""
        self.inline += 1
        if probe and took < self.inline_below_s:  # fast again: back on the loop
            self.average_s, self.probe_every = took, FIRST_PROBE_EVERY
            return
        if probe:  # still slow: probe less often
            self.probe_every = min(2 * self.probe_every, MAX_PROBE_EVERY)
            self._until_probe = self.probe_every
            return
        self.average_s += WEIGHT * (took - self.average_s)
        if self.average_s >= self.inline_below_s:  # the disk is slow: to the thread from now
            self._until_probe = self.probe_every

    def prefill(self, size: int) -> int:
        """Zero-fill the WAL from its end to ``size`` bytes and fsync it; the bytes added.

        A commit that grows the WAL makes its fsync write the file's new size and blocks
        too (a metadata change in the file system's journal): about 0.3 ms against 0.15 for
        an overwrite of the same pages, on the machines measured. SQLite overwrites its WAL
        from the start after a checkpoint and never shrinks it (``journal_size_limit`` is
        not set), so only a fresh WAL grows: every commit until the first checkpoint, 16 MB
        after each start. PostgreSQL zero-fills its WAL segments for the same reason.
        Frames past the last valid one are never read: recovery stops at the first frame
        whose salt or checksum does not match the header (zeros never do), and a fresh WAL
        whose header is zeros is an empty one. The caller holds SQLite's write lock, so no
        commit appends meanwhile; only bytes past the file's end are written."""
        try:
            fd = os.open(self.wal, os.O_WRONLY)
        except FileNotFoundError:
            return 0  # SQLite makes it at its first write; the next start fills it
        try:
            end = at = os.fstat(fd).st_size
            zeros = memoryview(bytes(PREFILL_CHUNK))
            while at < size:
                at += os.pwrite(fd, zeros[: min(PREFILL_CHUNK, size - at)], at)
            if at > end:
                os.fsync(fd)
            return at - end
        finally:
            os.close(fd)


class WalFile:
    """The WAL, held open for its fsyncs.

    A durable commit's fsync then needs no new descriptor: with the process's
    descriptors used up, opening the WAL after a commit failed, and a request whose
    change had committed was answered 500. The file is opened again when the one at
    the path is another (SQLite deleted the WAL as its last connection closed, and
    made a new one). Only one fsync runs at a time (``WalSync._syncing``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file held

    def fsync(self) -> float:
        """fsync the WAL; the seconds the fsync took (0 when there is no WAL)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            self.close()
            return 0.0  # no WAL: the last connection checkpointed it into the (synced) database
        if self._fd is None or (now.st_dev, now.st_ino) != self._identity:
            self.close()
            fd = os.open(self.path, os.O_RDONLY)
            held = os.fstat(fd)
            self._fd, self._identity = fd, (held.st_dev, held.st_ino)
        started = time.perf_counter()
        os.fsync(self._fd)
        return time.perf_counter() - started

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._identity = None
