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
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

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


async def test_a_new_database_jumps_and_is_marked(pg_url: str) -> None:
    db = await _open(pg_url)
    try:
        # A crash that forgot every event leaves what a new database has: both jump.
        assert await _append(db, 2) == [SEQ_JUMP + 1, SEQ_JUMP + 2]
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


# -- a real crash -------------------------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[str]:
    """A PostgreSQL cluster of this test's own (a backend killed here resets only it)."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not bins:
        missing = "PostgreSQL's server binaries (initdb) are not installed"
        if os.environ.get("CORRAL_REQUIRE_SERVICES") == "1":
            pytest.fail(missing)  # CI installs PostgreSQL: never pass by skipping there
        pytest.skip(missing)
    bin_dir = bins[-1].parent
    home = Path(tempfile.mkdtemp(prefix="corral-pg-"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(home, "postgres")
    port = _free_port()
    ctl = [*as_user, str(bin_dir / "pg_ctl"), "-D", str(home / "data")]
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
    options += " -c wal_writer_delay=10s"  # relaxed commits stay in memory until the crash
    try:
        initdb = [str(bin_dir / "initdb"), "-D", str(home / "data"), "-A", "trust"]
        subprocess.run(
            [*as_user, *initdb, "-U", "postgres", "--no-sync"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*ctl, "-o", options, "-l", str(home / "log"), "-w", "start"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


async def test_a_real_crash_of_postgresql_is_noticed(own_postgres: str) -> None:
    db = await _open(own_postgres)
    try:
        async with db.write(durable=False) as conn:  # relaxed: its events go out unflushed
            seen = await event_repo.append(
                conn, [TeamEvent(Event(EventKind.JOB_STARTED, 1.0, "a"), "t")]
            )
        victim = await _sql(db, "SELECT pg_backend_pid()")
        os.kill(int(str(victim)), signal.SIGKILL)  # PostgreSQL resets every backend and recovers
        await db.engine.dispose()
        await _until_up(db)
        assert await _sql(db, "SELECT count(*) FROM event_epoch") == 0, "recovery emptied it"
        last = await _sql(
            db, "SELECT pg_sequence_last_value(pg_get_serial_sequence('events', 'seq'))"
        )
        first = await _append(db)
        # With the WAL writer asleep, the crash forgets the relaxed commit and the sequence's
        # draw for it (last is None: seq SEQ_JUMP + 1 would be given out again without this).
        assert first == [int(str(last or 0)) + SEQ_JUMP + 1]
        assert first[0] > max(seen)
    finally:
        await db.close()


async def _until_up(db: Database, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await _sql(db, "SELECT 1")
            return
        except Exception:
            await db.engine.dispose()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
