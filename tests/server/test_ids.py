"""Ids of jobs and allocations sort by when they were made, so rows committed together share
index pages (``store/ids.py``)."""

from __future__ import annotations

import re
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from server_harness import World

from corral.core.model import Job
from corral.server.services.jobs import new_job_id
from corral.server.store import jobs as job_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.ids import sortable_id
from corral.server.store.records import JobRecord

SHAPE = re.compile(r"(job_|al_)[0-9a-f]{22}")
ID_COLUMN = 40  # jobs.id and allocations.id are String(40)


def test_ids_sort_by_the_millisecond_they_were_made() -> None:
    start = 1_764_000_000_000 // 2**32 * 2**32  # a wrap of the 32 bits of milliseconds
    made = [start + k for k in (0, 1, 2, 15, 16, 999, 86_400_000, 40 * 86_400_000)]
    ids = [sortable_id("job_", ms * 1_000_000 + 999_999) for ms in made]
    assert ids == sorted(ids)
    assert all(SHAPE.fullmatch(i) and len(i) <= ID_COLUMN for i in ids)
    assert ids[0][4:12] == f"{made[0] % 2**32:08x}"  # the time first, then the random part
    wrapped = sortable_id("job_", (start + 2**32) * 1_000_000)  # 49.7 days on: from the start
    assert wrapped[4:12] == ids[0][4:12]


def test_ids_made_in_one_millisecond_do_not_collide() -> None:
    same = 1_764_000_000_000 * 1_000_000
    ids = {sortable_id("al_", same) for _ in range(20_000)}
    assert len(ids) == 20_000
    assert len({i[:11] for i in ids}) == 1  # one time prefix, 56 random bits each


@pytest.mark.anyio
async def test_jobs_and_allocations_get_ids_in_the_order_they_were_made(world: World) -> None:
    first = await world.submit(resources={"cpus": 1})
    time.sleep(0.002)
    second = await world.submit(resources={"cpus": 1})
    assert SHAPE.fullmatch(first.job.id)
    assert SHAPE.fullmatch(second.job.id)
    assert first.job.id < second.job.id

    await world.agent("n1", cpus=8)
    placed = (await world.cycle()).placed
    time.sleep(0.002)
    third = await world.submit(resources={"cpus": 1})
    later = (await world.cycle()).placed
    assert [a.jobs[0].job_id for a in later] == [third.job.id]
    assert all(SHAPE.fullmatch(a.allocation_id) for a in [*placed, *later])
    assert max(a.allocation_id for a in placed) < later[0].allocation_id


def _wal_frames(path: Path) -> int:
    """Frames in the WAL of the database at ``path`` (4,096-byte pages)."""
    size = path.with_name(path.name + "-wal").stat().st_size
    return max(0, size - 32) // (4096 + 24)


MEASURED = 4  # commits of 16 new jobs whose WAL frames are counted


async def _frames_of_new_groups(path: Path, make_id: Callable[[], str]) -> int:
    """WAL frames ``MEASURED`` commits of 16 new jobs write into a database holding 3,000 jobs
    whose ids ``make_id`` made, in commits of 16 (a millisecond's pause every 20 commits)."""
    db = Database(parse_db(str(path)))
    await db.prepare()
    try:
        for group in range(188):
            recs = [JobRecord(job=Job(id=make_id())) for _ in range(16)]
            async with db.write() as conn:
                await job_repo.insert_many(conn, recs)
            if group % 20 == 0:
                time.sleep(0.001)
        with sqlite3.connect(path) as raw:
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        assert _wal_frames(path) == 0
        for _ in range(MEASURED):
            time.sleep(0.002)
            recs = [JobRecord(job=Job(id=make_id())) for _ in range(16)]
            async with db.write() as conn:
                await job_repo.insert_many(conn, recs)
        return _wal_frames(path)
    finally:
        await db.close()


@pytest.mark.anyio
async def test_a_group_of_new_jobs_writes_few_index_pages(tmp_path: Path) -> None:
    """With random ids each new job's index entry landed on a page of its own; sortable ones
    put the group's entries together (the pages every commit writes, fsyncs and copies back)."""
    random_ids = await _frames_of_new_groups(tmp_path / "random.db", lambda: secrets.token_hex(14))
    sortable = await _frames_of_new_groups(tmp_path / "sortable.db", new_job_id)
    # Both write the table's own pages (16 rows of about 400 bytes) and the other indexes'
    # right-hand leaves; random ids add a leaf of the id index per job or nearly (about 13 of
    # its 40 leaves a commit, here), sortable ones one or two. Counted over several commits:
    # one commit's count moves with where its 16 random ids happen to fall.
    assert random_ids - sortable >= 8 * MEASURED, (random_ids, sortable)
