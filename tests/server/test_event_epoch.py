"""Event numbers after a crash of PostgreSQL (``events.pg_mark_epoch``, migration 0007).

Events of relaxed commits reach readers before PostgreSQL flushes their WAL;
a crash forgets them and the sequence's advance alike. What crash recovery
leaves behind is staged here on a real server: the unlogged marker emptied
(what recovery does to every unlogged table) and the sequence set back (what
losing the tail of the WAL does to it), with every connection new. The first
event appended after that must be numbered past anything a reader saw.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.events import Event, EventKind
from corral.server.store import events as event_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.events import SEQ_JUMP, TeamEvent

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


async def _open(url: str) -> Database:
    db = Database(parse_db(url))
    await db.prepare()
    return db


async def _append(db: Database, n: int = 1) -> list[int]:
    batch = [TeamEvent(Event(EventKind.JOB_SUBMITTED, float(i), f"j{i}"), "t") for i in range(n)]
    async with db.write() as conn:
        return await event_repo.append(conn, batch)


async def _sql(db: Database, statement: str) -> object:
    async with db.engine.begin() as conn:
        result = await conn.execute(sa.text(statement))
        return result.scalar() if result.returns_rows else None


async def test_a_new_database_numbers_from_one_and_is_marked(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        assert await _append(db, 2) == [1, 2]
        assert await _sql(db, "SELECT count(*) FROM event_epoch") == 1
        persistence = await _sql(
            db, "SELECT relpersistence::text FROM pg_class WHERE oid = 'event_epoch'::regclass"
        )
        assert persistence == "u", "crash recovery empties only unlogged tables"
    finally:
        await db.close()


async def test_after_crash_recovery_the_first_event_jumps_past_the_forgotten_ones(
    pg_url: str,
) -> None:
    db = await _open(pg_url)
    try:
        seen = await _append(db, 3)  # a reader saw these; the crash forgets the last two
        await _sql(db, f"SELECT setval(pg_get_serial_sequence('events', 'seq'), {seen[0]})")
        await _sql(db, "TRUNCATE event_epoch")
    finally:
        await db.close()  # a crash closes every connection
    db = await _open(pg_url)
    try:
        first = await _append(db)
        assert first[0] > max(seen), "a forgotten event's number was given out again"
        assert first == [seen[0] + SEQ_JUMP + 1]
        assert await _sql(db, "SELECT count(*) FROM event_epoch") == 1
        assert await _append(db) == [first[0] + 1], "one jump per recovery, not per event"
    finally:
        await db.close()


async def test_a_clean_restart_keeps_the_numbers(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        before = await _append(db)
    finally:
        await db.close()
    db = await _open(pg_url)  # new connections, the marker still there: no jump
    try:
        assert await _append(db) == [before[0] + 1]
    finally:
        await db.close()


async def test_of_two_new_connections_racing_only_the_first_jumps(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        seen = await _append(db)
        await _sql(db, "TRUNCATE event_epoch")
        await db.engine.dispose()  # the pool's connections are gone, as after a crash
        pids: list[int] = []

        async def write(job: str) -> list[int]:
            async with db.write() as conn:
                pids.append(await _backend(conn))
                await asyncio.sleep(0.05)  # the other writer is new too, and waits its turn
                batch = [TeamEvent(Event(EventKind.JOB_SUBMITTED, 1.0, job))]
                return await event_repo.append(conn, batch)

        first, second = sorted(await asyncio.gather(write("a"), write("b")))
        assert len(set(pids)) == 2, "two connections"
        assert first == [seen[0] + SEQ_JUMP + 1]
        assert second == [first[0] + 1]
    finally:
        await db.close()


async def _backend(conn: AsyncConnection) -> int:
    return int((await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one())
