"""One server process per SQLite file: an exclusive lock file next to the database.

SQLite is the one-process store (DESIGN.md section 6): the scheduling loop,
the liveness loop and the write lock all assume nobody else writes the file.
A second ``corral server`` on the same file would run a second scheduling
loop and hand the same GPU out twice, so it is refused at start with a clear
message. The lock is ``flock`` on ``<db>.lock``: the kernel drops it when the
process dies (even by ``kill -9``), so a crashed server never blocks its
restart. Several replicas need PostgreSQL.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

from corral.core.errors import Unavailable

LOCK_FILE_MODE = 0o600  # private to the server's user, like the database (server/permissions.py)


class StoreInUse(Unavailable):
    """Another process holds this SQLite database."""


class SqliteLock:
    """Held from ``acquire`` to ``release`` (or the end of the process)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.path = db_path.with_name(db_path.name + ".lock")
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> None:
        """Take the lock, or raise ``StoreInUse`` naming the holder. Idempotent."""
        if self._file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, LOCK_FILE_MODE), "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            handle.close()
            raise StoreInUse(
                f"another corral server{holder} is already using the SQLite database "
                f"{self.db_path} (lock file {self.path}). SQLite serves one server process: "
                "stop the other one, give this one its own --db, or run several replicas "
                "on PostgreSQL (--db postgresql://...)."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()


def _holder(handle: IO[str]) -> str:
    """`` (pid N)`` from the lock file, when the holder wrote it."""
    handle.seek(0)
    text = handle.read().strip()
    return f" (pid {text})" if text.isdigit() else ""
