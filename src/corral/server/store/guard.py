"""Guarded updates: change a row only if nobody changed it since we read it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.sql import Query


async def guarded_update(
    conn: AsyncConnection,
    table: sa.Table,
    key: tuple[str, Any],
    version: int,
    values: dict[str, Any],
) -> bool:
    """``UPDATE table SET values, version+1 WHERE key AND version``; True when the row matched.

    A False return means the row moved on (or vanished): the caller's view is
    stale, and it must re-read and decide again rather than force the write.
    """
    column, value = key
    query = _update(table, column, tuple(values))
    return await query.run(conn, k_key=value, k_version=version, **values) == 1


async def guarded_update_many(
    conn: AsyncConnection,
    table: sa.Table,
    column: str,
    rows: Sequence[tuple[Any, int, dict[str, Any]]],
) -> set[Any]:
    """``guarded_update`` of many rows, each (key, version, values); the keys whose row
    matched. One statement each: each row's answer is its own."""
    return {
        key
        for key, version, values in rows
        if await guarded_update(conn, table, (column, key), version, values)
    }


@functools.lru_cache(maxsize=512)
def _update(table: sa.Table, column: str, names: tuple[str, ...]) -> Query:
    """The UPDATE for one set of columns, compiled once per database."""
    return Query(
        sa.update(table)
        .where(
            table.c[column] == sa.bindparam("k_key", type_=table.c[column].type),
            table.c.version == sa.bindparam("k_version", type_=table.c.version.type),
        )
        .values(
            {n: sa.bindparam(n, type_=table.c[n].type) for n in names}
            | {"version": table.c.version + sa.literal_column("1")}
        )
    )
