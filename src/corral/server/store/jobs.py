"""Queries on the ``jobs`` table."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.states import JobState
from corral.server.store.guard import guarded_update, guarded_update_many
from corral.server.store.records import JobRecord, job_from_row, job_row
from corral.server.store.sql import Query, insert_rows, rows_by_keys
from corral.server.store.tables import jobs

_SECOND = itemgetter(1)
_GET = Query(sa.select(jobs).where(jobs.c.id == sa.bindparam("id")))
_GET_MANY = Query(rows_by_keys(jobs, "id"))
_QUEUED_WITH = {  # (id, column) of every queued job, by submission order
    column: Query(
        sa.select(jobs.c.id, jobs.c[column])
        .where(jobs.c.state == sa.bindparam("state"))
        .order_by(jobs.c.seq)
    )
    for column in ("team", "version")
}
_NEWEST_IDS = Query(
    sa.select(jobs.c.id)
    .where(jobs.c.state == sa.bindparam("state"))
    .order_by(jobs.c.seq.desc())
    .limit(sa.bindparam("limit", type_=sa.Integer))
)


async def insert(conn: AsyncConnection, rec: JobRecord) -> None:
    await insert_many(conn, [rec])


async def insert_many(conn: AsyncConnection, recs: Sequence[JobRecord]) -> None:
    await insert_rows(conn, jobs, [job_row(r) for r in recs])


async def get(conn: AsyncConnection, job_id: str) -> JobRecord | None:
    row = await _GET.first(conn, id=job_id)
    return job_from_row(row) if row else None


async def get_many(conn: AsyncConnection, ids: Collection[str]) -> dict[str, JobRecord]:
    if len(ids) == 1:  # nearly every call: the lookup by one key is the cheaper statement
        (job_id,) = ids
        row = await _GET.first(conn, id=job_id)
        return {job_id: job_from_row(row)} if row else {}
    if not ids:
        return {}
    rows = await _GET_MANY.rows(conn, keys=list(dict.fromkeys(ids)))
    return {r.id: job_from_row(r) for r in rows}


async def by_idempotency_keys(
    conn: AsyncConnection, team: str, keys: Collection[str]
) -> dict[str, JobRecord]:
    """Existing jobs of ``team`` submitted with any of ``keys``, by key."""
    if not keys:
        return {}
    rows = await conn.execute(
        sa.select(jobs).where(jobs.c.team == team, jobs.c.idempotency_key.in_(list(keys)))
    )
    return {r.idempotency_key: job_from_row(r) for r in rows}


async def newest_ids(conn: AsyncConnection, state: JobState, limit: int) -> list[str]:
    """Ids of the ``limit`` latest submitted jobs in ``state``, newest first: a narrow read
    of the state's index, for callers that read whole only the jobs they have not seen."""
    rows = await _NEWEST_IDS.tuples(conn, state=state.value, limit=limit)
    return [r[0] for r in rows]


async def after_seq(conn: AsyncConnection, seq: int, limit: int) -> list[JobRecord]:
    """Jobs submitted after ``seq``, oldest first (for streaming exports)."""
    query = sa.select(jobs).where(jobs.c.seq > seq).order_by(jobs.c.seq).limit(limit)
    return [job_from_row(r) for r in await conn.execute(query)]


async def queued_teams(conn: AsyncConnection) -> list[tuple[str, str]]:
    """(id, team) of every queued job, in submission order: a narrow read (decoding every
    queued job's row took 2 s at 40,000 on a slow machine)."""
    return await _queued_with(conn, "team")


async def queued_versions(conn: AsyncConnection) -> list[tuple[str, int]]:
    """(id, version) of every queued job in submission order: cheap, for the change feed."""
    return await _queued_with(conn, "version")


async def _queued_with(conn: AsyncConnection, column: str) -> list[tuple[str, Any]]:
    """(id, ``column``) of every queued job, in submission order."""
    rows = await _QUEUED_WITH[column].tuples(conn, state=JobState.QUEUED.value)
    return [(r[0], r[1]) for r in rows]


# -- what changed in the queue (SQLite: the triggers of migration 0006) -----------------------

QUEUE_TRIGGER = "jobs_queue_update"


def follows_queue_changes(db: sqlite3.Connection) -> bool:
    """Does this database record its queue's changes in ``job_changes``?"""
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = ?"
    return db.execute(sql, (QUEUE_TRIGGER,)).fetchone() is not None


def last_queue_change(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT coalesce(max(n), 0) FROM job_changes").fetchone()[0])


def queue_changes(
    db: sqlite3.Connection, after: int
) -> tuple[int, list[str], list[tuple[int, str, int]]]:
    """The changes after ``after``, in one read: the last change's ``n``, the ids of the
    jobs changed (repeats removed, in commit order), and (seq, id, version) of those
    still queued now."""
    sql = (
        "SELECT c.n, c.job_id, j.seq, j.version, j.state FROM job_changes c"
        " LEFT JOIN jobs j ON j.id = c.job_id WHERE c.n > ? ORDER BY c.n"
    )
    rows = db.execute(sql, (after,)).fetchall()
    if not rows:
        return after, [], []
    queued = JobState.QUEUED.value
    now = {
        job_id: (seq, job_id, version) for _, job_id, seq, version, state in rows if state == queued
    }
    return int(rows[-1][0]), list(dict.fromkeys(map(_SECOND, rows))), list(now.values())


def queued_seqs(db: sqlite3.Connection) -> list[tuple[int, str, int]]:
    """(seq, id, version) of every queued job, by submission order."""
    sql = "SELECT seq, id, version FROM jobs WHERE state = ? ORDER BY seq"
    return list(db.execute(sql, (JobState.QUEUED.value,)))


def forget_queue_changes(db: sqlite3.Connection, upto: int) -> int:
    """Delete the changes before ``upto`` (read by every cycle since); how many. The row
    ``upto`` stays: a new row's ``n`` is one more than the largest left, and must stay
    above every ``n`` a reader has seen."""
    return db.execute("DELETE FROM job_changes WHERE n < ?", (upto,)).rowcount


async def update(conn: AsyncConnection, rec: JobRecord, **values: Any) -> bool:
    """Guarded by ``rec.version``: False when the job changed since ``rec`` was read."""
    return await guarded_update(conn, jobs, ("id", rec.job.id), rec.version, values)


async def update_many(
    conn: AsyncConnection, changes: Sequence[tuple[JobRecord, dict[str, Any]]]
) -> set[str]:
    """``update`` of many jobs (every change setting the same columns); the ids that matched."""
    rows = [(rec.job.id, rec.version, values) for rec, values in changes]
    return await guarded_update_many(conn, jobs, "id", rows)


async def user_queue_front(conn: AsyncConnection, team: str, user: str) -> float | None:
    """The earliest place in ``user``'s own queue (of ``team``): the least ``queue_at`` or,
    for a job never moved, ``submitted_at``, of its queued jobs (None: none queued)."""
    place = sa.func.coalesce(jobs.c.queue_at, jobs.c.submitted_at)
    query = sa.select(sa.func.min(place)).where(
        jobs.c.team == team, jobs.c.user == user, jobs.c.state == JobState.QUEUED.value
    )
    value = (await conn.execute(query)).scalar()
    return None if value is None else float(value)
