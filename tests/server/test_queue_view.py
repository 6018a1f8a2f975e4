"""``QueueView``: the queued jobs followed through SQLite's ``job_changes`` triggers, and the
same view taken whole (PostgreSQL). A real migrated database file in each test."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.core.model import Job
from corral.core.states import JobState
from corral.server.loops.queue_view import QueueView
from corral.server.store import jobs as job_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.records import JobRecord
from corral.server.store.sql import sqlite_connection

pytestmark = pytest.mark.anyio


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(parse_db(str(tmp_path / "q.db")))
    await database.prepare()
    try:
        yield database
    finally:
        await database.close()


async def _insert(db: Database, *ids: str) -> None:
    async with db.write() as conn:
        await job_repo.insert_many(conn, [JobRecord(job=Job(id=i)) for i in ids])


async def _move(db: Database, job_id: str, state: JobState) -> None:
    async with db.write() as conn:
        rec = await job_repo.get(conn, job_id)
        assert rec is not None
        assert await job_repo.update(conn, rec, state=state.value)


async def _follow(db: Database, view: QueueView) -> dict[str, int | None]:
    async with db.read() as conn:
        raw = sqlite_connection(conn)
        assert raw is not None, "SQLite runs inline"
        return view.follow(raw)


def _truth(path: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(path) as other:
        sql = "SELECT id, version FROM jobs WHERE state = 'queued' ORDER BY seq"
        return list(other.execute(sql))


async def test_following_sees_every_way_in_and_out_of_the_queue(
    db: Database, tmp_path: Path
) -> None:
    view = QueueView()
    await _insert(db, "a", "b", "c")
    assert await _follow(db, view) == {"a": 1, "b": 1, "c": 1}, "the first read takes all"
    assert view.order == ["a", "b", "c"]
    assert await _follow(db, view) == {}
    assert view.followed == 0, "nothing changed: nothing read"

    await _move(db, "a", JobState.PLACED)  # placed: leaves
    await _insert(db, "d")  # submitted: joins at the end
    assert await _follow(db, view) == {"a": None, "d": 1}
    assert view.order == ["b", "c", "d"]

    await _move(db, "a", JobState.QUEUED)  # requeued: back in its own place, by seq
    async with db.write() as conn:  # a queued job's row changes: its version moves
        rec = await job_repo.get(conn, "c")
        assert rec is not None
        assert await job_repo.update(conn, rec, progress=0.5)
    assert await _follow(db, view) == {"a": 3, "c": 2}
    assert view.order == ["a", "b", "c", "d"]

    async with db.write() as conn:  # a queued job deleted
        await conn.execute(sa.text("DELETE FROM jobs WHERE id = 'b'"))
    await _move(db, "d", JobState.CANCELLED)
    assert await _follow(db, view) == {"b": None, "d": None}
    assert view.versions == dict(_truth(tmp_path / "q.db"))
    assert view.order == [job_id for job_id, _ in _truth(tmp_path / "q.db")]


async def test_changes_are_read_once_and_given_in_submission_order(db: Database) -> None:
    view = QueueView()
    await _insert(db, "a")
    await _follow(db, view)
    await _insert(db, "b", "c")
    assert await _follow(db, view) == {"b": 1, "c": 1}
    assert await _follow(db, view) == {}, "nothing new since"
    assert view.followed == 0
    assert view.in_order({"c", "a"}) == ["a", "c"]


async def test_forgotten_changes_are_gone_and_following_goes_on(db: Database) -> None:
    view = QueueView()
    await _insert(db, "a", "b")
    await _follow(db, view)
    assert view.mark is not None
    async with db.write() as conn:
        raw = sqlite_connection(conn)
        assert raw is not None
        assert job_repo.forget_queue_changes(raw, view.mark) == 1, "all but the last"
    await _insert(db, "c")
    assert await _follow(db, view) == {"c": 1}, "a new change numbers past what was read"


def test_taking_the_whole_queue_reports_the_difference() -> None:
    view = QueueView()
    assert view.replace([("a", 1), ("b", 1)]) == {"a": 1, "b": 1}
    assert view.replace([("b", 2), ("c", 1)]) == {"a": None, "b": 2, "c": 1}
    assert view.order == ["b", "c"]
    assert view.mark is None, "taking it whole is not following"
