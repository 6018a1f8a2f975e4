"""Queries on the ``allocations`` table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.guard import guarded_update
from corral.server.store.records import AllocRecord, alloc_from_row, alloc_row
from corral.server.store.sql import Query, insert_rows, rows_by_keys
from corral.server.store.tables import allocations

_ID: sa.BindParameter[str] = sa.bindparam("id", type_=sa.String)
_GET = Query(sa.select(allocations).where(allocations.c.id == _ID))
_VERSION = Query(sa.select(allocations.c.version).where(allocations.c.id == _ID))
_GET_MANY = Query(rows_by_keys(allocations, "id"))
_ACTIVE = sa.select(allocations).where(allocations.c.active == sa.true()).order_by(allocations.c.id)
_ACTIVE_ALL = Query(_ACTIVE)
_ACTIVE_ON = Query(_ACTIVE.where(allocations.c.node == sa.bindparam("node")))
_ACTIVE_VERSIONS = Query(
    sa.select(allocations.c.id, allocations.c.version).where(allocations.c.active == sa.true())
)


async def insert(conn: AsyncConnection, rec: AllocRecord) -> None:
    await insert_many(conn, [rec])


async def insert_many(conn: AsyncConnection, recs: Sequence[AllocRecord]) -> None:
    await insert_rows(conn, allocations, [alloc_row(rec) for rec in recs])


async def get(
    conn: AsyncConnection, alloc_id: str, *, hint: AllocRecord | None = None
) -> AllocRecord | None:
    """The allocation, or None. ``hint``: the record as this server last wrote it
    (``Runtime.placed_allocs``); it is returned when the row's version is still its own,
    read alone instead of the row (a guarded update bumps the version on every change,
    so an equal version is the same row, and the version decodes no JSON)."""
    if hint is not None and hint.alloc.id == alloc_id:
        found = await _VERSION.first(conn, id=alloc_id)
        if found is not None and found.version == hint.version:
            return hint
    row = await _GET.first(conn, id=alloc_id)
    return alloc_from_row(row) if row else None


async def active(conn: AsyncConnection, node: str | None = None) -> list[AllocRecord]:
    """Allocations holding resources (pending or running), optionally on one node."""
    if node is None:
        rows = await _ACTIVE_ALL.rows(conn)
    else:
        rows = await _ACTIVE_ON.rows(conn, node=node)
    return [alloc_from_row(r) for r in rows]


async def active_versions(conn: AsyncConnection) -> dict[str, int]:
    return {r.id: r.version for r in await _ACTIVE_VERSIONS.rows(conn)}


async def get_many(conn: AsyncConnection, ids: list[str]) -> list[AllocRecord]:
    if not ids:
        return []
    rows = await _GET_MANY.rows(conn, keys=list(dict.fromkeys(ids)))
    return [alloc_from_row(r) for r in rows]


async def update(conn: AsyncConnection, rec: AllocRecord, **values: Any) -> bool:
    """Guarded by ``rec.version``: False when the allocation changed since it was read."""
    return await guarded_update(conn, allocations, ("id", rec.alloc.id), rec.version, values)
