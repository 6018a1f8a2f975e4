"""The server's state is for its own user only: folders 0700, files 0600 (item 13).

The attack: another user on the machine reads ``~/.corral``: the SQLite
database (token hashes, every job's payload and result), its WAL, the
results and uploaded models. Before the fix, under the usual umask 022, the
home was 0755 and ``corral.db`` 0644. A real ``corral server`` process starts
on a fresh home, and then on a home left world-readable (as an older corral
made it): both times every folder must end 0700 and every file 0600, the
second time with a warning naming each path it tightened.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from process_harness import ServerProcess

pytestmark = pytest.mark.slow
LOOSE_UMASK = 0o022  # the usual default: files 0644, folders 0755


@contextlib.contextmanager
def _running(home: Path) -> Iterator[ServerProcess]:
    old = os.umask(LOOSE_UMASK)  # the child inherits it
    try:
        server = ServerProcess(str(home / "corral.db"), home).start()
    finally:
        os.umask(old)
    try:
        yield server
    finally:
        server.stop()


def _modes(home: Path) -> dict[str, int]:
    """The permission bits of the home and everything corral keeps in it."""
    paths = [home, *sorted(home.rglob("*"))]
    return {str(p.relative_to(home)): stat.S_IMODE(p.stat().st_mode) for p in paths}


def _state() -> dict[str, int]:
    """The paths that must be private, each with the mode it must have."""
    files = ("corral.db", "corral.db-wal", "corral.db-shm", "corral.db.lock")
    return {".": 0o700, "blobs": 0o700, "models": 0o700} | dict.fromkeys(files, 0o600)


def _work(server: ServerProcess, token: str) -> None:
    """A submission, so the database and its WAL have been written."""
    headers = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{server.url}/v1/jobs", json={"kind": "sample"}, headers=headers, timeout=10)
    assert r.status_code == 201, r.text


def test_a_fresh_home_is_made_private(tmp_path: Path) -> None:
    home = tmp_path / "corral-home"
    with _running(home) as server:
        assert server.admin_token
        _work(server, server.admin_token)
        modes = _modes(home)
    assert {p: modes.get(p) for p in _state()} == _state()
    assert not any(m & 0o077 for m in modes.values()), f"open to others: {modes}"
    assert not any("was mode" in line for line in server.output), "nothing to tighten"


def test_a_home_left_readable_is_tightened_with_a_warning(tmp_path: Path) -> None:
    home = tmp_path / "corral-home"
    with _running(home) as first:
        token = first.admin_token
        assert token
        _work(first, token)
    for path in [home, *home.rglob("*")]:  # as an older corral (or a loose umask) left them
        path.chmod(0o755 if path.is_dir() else 0o644)

    with _running(home) as second:
        _work(second, token)  # the same database, the same admin token
        modes = _modes(home)
    assert {p: modes.get(p) for p in _state()} == _state()
    warned = "\n".join(second.output)
    for name in ("corral.db", "blobs", "models"):
        assert f"{home / name} was mode" in warned, warned
    assert f"{home} was mode 755: made 700" in warned
