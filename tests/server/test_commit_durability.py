"""Which commits wait for the disk (SQLite), and when the scheduling loop runs after a trigger."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa
from server_harness import World

from corral.server.services.unit import Tx
from corral.server.store.db import Database, parse_db

pytestmark = pytest.mark.anyio

FULL, NORMAL = 2, 1  # what PRAGMA synchronous reads back


async def _level(db: Database, **write: bool) -> int:
    async with db.write(**write) as conn:
        return int((await conn.execute(sa.text("PRAGMA synchronous"))).scalar_one())


async def test_only_writes_marked_not_durable_skip_the_fsync(tmp_path: Path) -> None:
    db = Database(parse_db(str(tmp_path / "c.db")))
    await db.prepare()
    try:
        assert await _level(db) == FULL
        assert await _level(db, durable=False) == NORMAL
        assert await _level(db) == FULL, "the relaxed level must not stick to the connection"
    finally:
        await db.close()


async def test_a_configured_off_stays_off_for_relaxed_writes(tmp_path: Path) -> None:
    db = Database(parse_db(str(tmp_path / "c.db")), sqlite_synchronous="OFF")
    await db.prepare()
    try:
        assert await _level(db, durable=False) == 0
        assert await _level(db) == 0
    finally:
        await db.close()


async def test_a_group_with_one_durable_unit_commits_durably(tmp_path: Path) -> None:
    world = await World.open(f"sqlite:///{tmp_path / 'w.db'}", tmp_path)
    try:
        group = world.plane.agents.updates

        async def level(tx: Tx) -> int:
            return int((await tx.conn.execute(sa.text("PRAGMA synchronous"))).scalar_one())

        relaxed = await asyncio.gather(
            group.run(level, durable=False), group.run(level, durable=False)
        )
        mixed = await asyncio.gather(group.run(level, durable=False), group.run(level))
        assert list(relaxed) == [NORMAL, NORMAL]
        assert list(mixed) == [FULL, FULL]
    finally:
        await world.close()


async def test_a_trigger_after_a_quiet_spell_is_scheduled_at_once_and_bursts_are_paced(
    tmp_path: Path,
) -> None:
    world = await World.open(f"sqlite:///{tmp_path / 'w.db'}", tmp_path, debounce_s=60.0)
    loop = world.plane.schedule
    runner = asyncio.create_task(loop.run())
    try:
        world.plane.rt.schedule_needed.fire()
        for _ in range(100):  # the virtual clock never moves: only an immediate cycle can run
            await asyncio.sleep(0.01)
            if loop.cycles:
                break
        assert loop.cycles == 1, "the first trigger waits for nothing"
        world.plane.rt.schedule_needed.fire()
        await asyncio.sleep(0.2)
        assert loop.cycles == 1, "the next cycle waits out the spacing (60 s of virtual time)"
        world.clock.advance(60.0)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if loop.cycles == 2:
                break
        assert loop.cycles == 2
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await world.close()
