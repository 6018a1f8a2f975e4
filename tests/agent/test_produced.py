"""``ProducedFiles``: results kept by sha256 for a next step on the same machine, taken as
hard links (no bytes copied), bounded in files and bytes, least recently used first out."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from corral.agent.produced import ProducedFiles

pytestmark = pytest.mark.anyio


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_kept_file_is_taken_as_a_hard_link(tmp_path: Path) -> None:
    made = tmp_path / "out" / "latent.bin"
    made.parent.mkdir()
    made.write_bytes(b"latent")
    kept = ProducedFiles(tmp_path / "produced")
    await kept.keep(sha(b"latent"), made)
    made.unlink()  # the results folder goes once its end is acknowledged
    into = tmp_path / "job" / "in.bin"
    taken = await kept.take(sha(b"latent"), into)
    assert taken == into
    assert into.read_bytes() == b"latent"
    assert into.stat().st_nlink == 2  # the kept copy and this one: one file, no copy
    assert await kept.take(sha(b"other"), tmp_path / "x") is None
    assert await kept.take("../../etc/passwd", tmp_path / "y") is None
    assert kept.reused == 1


async def test_the_least_recently_used_go_first_past_the_bounds(tmp_path: Path) -> None:
    kept = ProducedFiles(tmp_path / "produced", max_files=2, max_bytes=1000)
    for age, data in enumerate((b"one", b"two", b"three")):
        await kept.keep(sha(data), data)
        os.utime(kept.root / sha(data), (1000.0 + age, 1000.0 + age))  # made in this order
    assert await kept.take(sha(b"one"), tmp_path / "1") is None  # the oldest went
    assert await kept.take(sha(b"three"), tmp_path / "3") is not None
    await kept.keep(sha(b"big"), b"x" * 1001)  # alone past the byte bound: not kept
    assert await kept.take(sha(b"big"), tmp_path / "b") is None
    assert await kept.take(sha(b"three"), tmp_path / "3b") is not None  # the others stay
