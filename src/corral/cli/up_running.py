"""Which ``corral up`` serves a data directory: ``<data-dir>/up.json`` names its pid and URL.

Two servers on one SQLite file and one admin token would fight over the queue and
the ports; the second one says where the first already serves instead, in one line.
A record whose process is gone (killed, machine rebooted) is stale and ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

RECORD = "up.json"


def running(home: Path) -> tuple[int, str] | None:
    """(pid, URL) of the live ``corral up`` serving ``home``, or None."""
    try:
        record = json.loads((home / RECORD).read_text())
        pid, url = int(record["pid"]), str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid() or not _alive(pid):
        return None
    return pid, url


def record(home: Path, url: str) -> None:
    """Note that this process serves ``home`` at ``url``."""
    (home / RECORD).write_text(json.dumps({"pid": os.getpid(), "url": url}) + "\n")


def forget(home: Path) -> None:
    """Remove this process's record (another's stays)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if json.loads((home / RECORD).read_text())["pid"] == os.getpid():
            (home / RECORD).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True
