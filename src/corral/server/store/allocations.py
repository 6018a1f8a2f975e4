"""Queries on the ``allocations`` table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store import pgraw
from corral.server.store.guard import guarded_update
from corral.server.store.rawsql import codec, driver
from corral.server.store.records import AllocRecord, alloc_from_row, alloc_row
from corral.server.store.tables import allocations, jobs

_RAW = codec(allocations)
_PG = pgraw.codec(allocations)


async def insert(conn: AsyncConnection, rec: AllocRecord) -> None:
    await insert_many(conn, [rec])


async def insert_many(conn: AsyncConnection, recs: Sequence[AllocRecord]) -> None:
    """Insert allocations (on PostgreSQL in one round trip: asyncpg pipelines the rows)."""
    if not recs:
        return
    rows = [alloc_row(rec) for rec in recs]
    db = driver(conn)
    if db is not None:
        _RAW.insert(db, rows)
        return
    raw = pgraw.pg(conn)
    if raw is not None:
        await _PG.insert(raw, rows)
        return
    await conn.execute(sa.insert(allocations), rows)


# Hot queries are built once (building a statement costs more than running it on SQLite).
_GET = sa.select(allocations).where(allocations.c.id == sa.bindparam("id"))
_GET_MANY = sa.select(allocations).where(allocations.c.id.in_(sa.bindparam("ids", expanding=True)))
_ACTIVE_VERSIONS = sa.select(allocations.c.id, allocations.c.version).where(
    allocations.c.active.is_(True)
)
_PG_ACTIVE_VERSIONS = "SELECT id, version FROM allocations WHERE active"
_VERSION = "SELECT version FROM allocations WHERE id = ?"


async def get(
    conn: AsyncConnection, alloc_id: str, *, hint: AllocRecord | None = None
) -> AllocRecord | None:
    """The allocation, or None. ``hint``: the record as this server last wrote it
    (``Runtime.placed_allocs``); on SQLite it is returned when the row's version is still
    its own, read alone instead of the row (a guarded update bumps the version on every
    change, so an equal version is the same row)."""
    db = driver(conn)
    if db is not None:
        if hint is not None and hint.alloc.id == alloc_id:
            found = db.execute(_VERSION, (alloc_id,)).fetchone()
            if found is not None and found[0] == hint.version:
                return hint
        rows = _RAW.by_keys(db, "id", [alloc_id])
        return alloc_from_row(rows[0]) if rows else None
    raw = pgraw.pg(conn)
    if raw is not None:
        return await _pg_get_with_jobs(conn, raw, alloc_id)
    row = (await conn.execute(_GET, {"id": alloc_id})).first()
    return alloc_from_row(row) if row else None


_PG_JOBS = pgraw.codec(jobs)
# The allocation and its jobs in one round trip: whoever reads an allocation by id
# (an agent's start or end, a cancel) reads its jobs next, and an end resets its node's
# failure streak unless it is 0 already (the last column; ``nodes.reset_streak``). Each
# job is looked up on its own (LATERAL ... LIMIT 1: never flattened into a join), so the
# plan is an index lookup per job even when it was prepared while the tables were small:
# as a plain join, the plan cached on a fresh schema was a hash join scanning every job.
_PG_GET_WITH_JOBS = (
    f"SELECT {', '.join(f'a.{c}' for c in _PG.select_columns)}, "
    f"{', '.join(f'j.{c}' for c in _PG_JOBS.select_columns)}, "
    "(SELECT n.failure_streak FROM nodes n WHERE n.name = a.node) AS node_streak "
    "FROM allocations a "
    "LEFT JOIN LATERAL json_array_elements_text(a.job_ids) AS k(id) ON true "
    "LEFT JOIN LATERAL (SELECT * FROM jobs WHERE jobs.id = k.id LIMIT 1) j ON true "
    "WHERE a.id = $1"
)
_JOB_ID_AT = _PG_JOBS.names.index("id")


async def _pg_get_with_jobs(conn: AsyncConnection, raw: Any, alloc_id: str) -> AllocRecord | None:
    rows = await raw.fetch(_PG_GET_WITH_JOBS, alloc_id)
    if not rows:
        return None
    width = len(_PG.names)
    seen = pgraw.seen_jobs(conn)
    for r in rows:
        job = r[width:-1]
        if job[_JOB_ID_AT] is not None:  # a job that is gone leaves NULLs
            seen[job[_JOB_ID_AT]] = _PG_JOBS.decode(job)
    rec = alloc_from_row(_PG.decode(rows[0][:width]))
    streak = rows[0][-1]
    if streak is not None:  # None: the node is gone
        pgraw.seen_streaks(conn)[rec.alloc.node] = streak
    return rec


async def active(conn: AsyncConnection, node: str | None = None) -> list[AllocRecord]:
    """Allocations holding resources (pending or running), optionally on one node."""
    db = driver(conn)
    if db is not None:
        clause = "WHERE active = 1" + (" AND node = ?" if node is not None else "") + " ORDER BY id"
        return [alloc_from_row(r) for r in _RAW.where(db, clause, [node] if node else [])]
    raw = pgraw.pg(conn)
    if raw is not None:
        clause = "WHERE active" + (" AND node = $1" if node is not None else "") + " ORDER BY id"
        return [alloc_from_row(r) for r in await _PG.where(raw, clause, [node] if node else [])]
    query = sa.select(allocations).where(allocations.c.active.is_(True))
    if node is not None:
        query = query.where(allocations.c.node == node)
    return [alloc_from_row(r) for r in await conn.execute(query.order_by(allocations.c.id))]


async def active_versions(conn: AsyncConnection) -> dict[str, int]:
    db = driver(conn)
    if db is not None:
        return dict(db.execute("SELECT id, version FROM allocations WHERE active = 1"))
    raw = pgraw.pg(conn)
    if raw is not None:
        return {r[0]: r[1] for r in await raw.fetch(_PG_ACTIVE_VERSIONS)}
    return {r.id: r.version for r in await conn.execute(_ACTIVE_VERSIONS)}


async def get_many(conn: AsyncConnection, ids: list[str]) -> list[AllocRecord]:
    if not ids:
        return []
    db = driver(conn)
    if db is not None:
        return [alloc_from_row(r) for r in _RAW.by_keys(db, "id", ids)]
    raw = pgraw.pg(conn)
    if raw is not None:
        return [alloc_from_row(r) for r in await _PG.by_keys(raw, "id", ids)]
    rows = await conn.execute(_GET_MANY, {"ids": ids})
    return [alloc_from_row(r) for r in rows]


async def update(conn: AsyncConnection, rec: AllocRecord, **values: Any) -> bool:
    """Guarded by ``rec.version``: False when the allocation changed since it was read."""
    return await guarded_update(conn, allocations, ("id", rec.alloc.id), rec.version, values)
