"""A SQLite store's WAL is copied back by the Checkpointer's thread, never inside a commit."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.server.store import wal_checkpoint
from corral.server.store.db import Database, parse_db

pytestmark = pytest.mark.anyio

PAGE = 4096


async def _write(db: Database, i: int) -> None:
    """One commit that dirties a few pages (a row of 3 KiB in a table of its own)."""
    async with db.write(durable=False) as conn:
        await conn.execute(
            sa.text("INSERT INTO filler (body) VALUES (:b)"), {"b": "x" * 3000 + str(i)}
        )


async def _open(tmp_path: Path) -> tuple[Database, Path]:
    db = Database(parse_db(str(tmp_path / "c.db")))
    await db.prepare()
    async with db.write() as conn:
        await conn.execute(sa.text("CREATE TABLE filler (id INTEGER PRIMARY KEY, body TEXT)"))
    return db, tmp_path / "c.db-wal"


def _frames(wal: Path) -> int:
    return max(0, (wal.stat().st_size - 32) // (PAGE + 24)) if wal.exists() else 0


async def _settle(db: Database) -> None:
    """Until the checkpoint under way (if any) has finished."""
    task = db.checkpointer._task if db.checkpointer is not None else None
    if task is not None:
        await asyncio.gather(task)


async def test_commits_do_not_checkpoint_and_the_checkpointer_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal_checkpoint, "EVERY_COMMITS", 10**9)  # none of its own, at first
    db, wal = await _open(tmp_path)
    checkpointer = db.checkpointer
    assert checkpointer is not None
    try:
        for i in range(400):  # about 800 pages: SQLite's default would checkpoint at 1,000
            await _write(db, i)
        grown = _frames(wal)
        for i in range(400):
            await _write(db, i)
        assert _frames(wal) > grown > 700, "no commit checkpointed (the WAL only grew)"
        assert checkpointer.checkpoints == 0

        monkeypatch.setattr(wal_checkpoint, "EVERY_COMMITS", 50)
        for i in range(50):
            await _write(db, i)
        await _settle(db)
        assert checkpointer.checkpoints == 1
        assert checkpointer.longest > 800
        with sqlite3.connect(tmp_path / "c.db") as other:  # the copy is in the database file
            assert other.execute("SELECT count(*) FROM filler").fetchone() == (850,)
    finally:
        await db.close()


async def test_the_wal_stays_bounded_while_writers_never_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal_checkpoint, "EVERY_COMMITS", 20)
    db, wal = await _open(tmp_path)
    checkpointer = db.checkpointer
    assert checkpointer is not None
    try:
        largest = 0
        for i in range(3000):  # back to back: each checkpoint overlaps the next commits
            await _write(db, i)
            await asyncio.sleep(0)  # a server's loop turns between commits
            largest = max(largest, _frames(wal))
        await _settle(db)
        assert checkpointer.checkpoints > 20
        assert checkpointer.held >= 1, "now and then one holds writers back: the WAL starts over"
        # 3,000 commits wrote about 6,000 pages; the WAL never held more than a few
        # checkpoints' worth (RESET_AFTER passive ones, then one holding writers back).
        assert checkpointer.longest < 6000 / 3, f"the WAL grew to {checkpointer.longest} frames"
        assert largest < 6000 / 3, f"the WAL file grew to {largest} frames"
    finally:
        await db.close()
    assert not wal.exists() or wal.stat().st_size == 0, "closing copies the rest back"


async def test_a_database_in_memory_has_no_checkpointer() -> None:
    db = Database(parse_db("sqlite:///:memory:"))
    assert db.checkpointer is None
