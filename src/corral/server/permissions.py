"""The server's state is for its own user only: folders 0700, files 0600 (issue 45, item 13).

The home (default ``~/.corral``), the blob folder (results, previews), the model
folder (uploads) and a SQLite database (token hashes, job payloads, results) hold
what no other user of the machine should read. ``make_private`` runs before the
server writes anything: it makes these folders 0700 and the database file 0600;
SQLite gives the database's ``-wal`` and ``-shm`` files the database's own mode,
and the lock file beside it is made 0600 (``sqlite_lock``), as is ``corral up``'s
``admin-token``.

State that exists already with more open modes (made by an older corral, by
hand, or under a loose umask) is tightened at start, with a warning naming the
path and both modes: nothing the server keeps is meant to be shared with other
users, and whoever needs a result reads it through the API. A path owned by
another user cannot be changed, and gets a warning only. Folders above these
(the parents of a ``--blob-dir``, of a ``--db`` file) are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from corral.server.settings import Settings
from corral.server.store.db import parse_db

log = logging.getLogger("corral.server")

FOLDER_MODE = 0o700
FILE_MODE = 0o600
DB_SIDE_FILES = ("-wal", "-shm", "-journal", ".lock")  # SQLite's files beside the database
HOME_FILES = ("admin-token",)  # ``corral up`` keeps the admin token here


def make_private(settings: Settings) -> list[Path]:
    """Create the server's state folders 0700 and its SQLite file 0600, and tighten those
    found more open; the paths tightened (each one logged)."""
    tightened: list[Path] = []
    db_file = sqlite_file(settings)
    for folder in state_folders(settings, db_file):
        folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        tightened += _tighten(folder, FOLDER_MODE)
    files = [settings.resolved_home() / name for name in HOME_FILES]
    if db_file is not None:
        _create(db_file)
        files += [db_file, *(db_file.with_name(db_file.name + s) for s in DB_SIDE_FILES)]
    for path in files:
        if path.exists():
            tightened += _tighten(path, FILE_MODE)
    return tightened


def sqlite_file(settings: Settings) -> Path | None:
    """The SQLite database file, or None (PostgreSQL, an in-memory database)."""
    target = parse_db(settings.db_url())
    database = target.url.database
    if target.dialect != "sqlite" or database in (None, "", ":memory:"):
        return None
    return Path(str(database))


def state_folders(settings: Settings, db_file: Path | None) -> list[Path]:
    """The folders the server owns: the blob and model folders, and the home when any of
    them or the database lies in it (a PostgreSQL server with both folders elsewhere
    does not make one)."""
    home = settings.resolved_home().resolve()
    folders = [settings.blob_path().resolve(), settings.model_path().resolve()]
    inside = [*folders, *([db_file.resolve()] if db_file is not None else [])]
    uses_home = any(home in p.parents for p in inside)
    return [home, *folders] if uses_home else folders


def _create(path: Path) -> None:
    """Make ``path`` empty with ``FILE_MODE`` if it is missing (an empty file is an empty
    SQLite database), so that it never exists with a looser mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))


def _tighten(path: Path, mode: int) -> list[Path]:
    """Take away every permission beyond ``mode`` from ``path``, warning when it had any."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current & ~mode == 0:
        return []
    try:
        path.chmod(current & mode)
    except PermissionError:
        log.warning(
            "%s is mode %o: other users may read corral's state; it is not ours to "
            "change (run the server as its owner, or chmod %o it)",
            path,
            current,
            mode,
        )
        return []
    log.warning(
        "%s was mode %o: made %o (corral's state is for the user running the server only)",
        path,
        current,
        current & mode,
    )
    return [path]
