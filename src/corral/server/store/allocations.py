"""Queries on the ``allocations`` table."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.guard import guarded_update
from corral.server.store.records import AllocRecord, alloc_from_row, alloc_row
from corral.server.store.tables import allocations


async def insert(conn: AsyncConnection, rec: AllocRecord) -> None:
    await conn.execute(sa.insert(allocations).values(**alloc_row(rec)))


# Hot queries are built once (building a statement costs more than running it on SQLite).
_GET = sa.select(allocations).where(allocations.c.id == sa.bindparam("id"))
_GET_MANY = sa.select(allocations).where(allocations.c.id.in_(sa.bindparam("ids", expanding=True)))
_ACTIVE_VERSIONS = sa.select(allocations.c.id, allocations.c.version).where(
    allocations.c.active.is_(True)
)


async def get(conn: AsyncConnection, alloc_id: str) -> AllocRecord | None:
    row = (await conn.execute(_GET, {"id": alloc_id})).first()
    return alloc_from_row(row) if row else None


async def active(conn: AsyncConnection, node: str | None = None) -> list[AllocRecord]:
    """Allocations holding resources (pending or running), optionally on one node."""
    query = sa.select(allocations).where(allocations.c.active.is_(True))
    if node is not None:
        query = query.where(allocations.c.node == node)
    return [alloc_from_row(r) for r in await conn.execute(query.order_by(allocations.c.id))]


async def active_versions(conn: AsyncConnection) -> dict[str, int]:
    return {r.id: r.version for r in await conn.execute(_ACTIVE_VERSIONS)}


async def get_many(conn: AsyncConnection, ids: list[str]) -> list[AllocRecord]:
    if not ids:
        return []
    rows = await conn.execute(_GET_MANY, {"ids": ids})
    return [alloc_from_row(r) for r in rows]


async def update(conn: AsyncConnection, rec: AllocRecord, **values: Any) -> bool:
    """Guarded by ``rec.version``: False when the allocation changed since it was read."""
    return await guarded_update(conn, allocations, ("id", rec.alloc.id), rec.version, values)
