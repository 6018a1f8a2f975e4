"""Guarded updates: change a row only if nobody changed it since we read it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store import pgraw
from corral.server.store.rawsql import codec, driver


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
    db = driver(conn)
    if db is not None:
        return codec(table).guarded_update(db, key, version, values)
    raw = pgraw.pg(conn)
    if raw is not None:
        if table.name in pgraw.READ_AHEAD_TABLES:
            pgraw.forget_read_ahead(conn)  # rows read ahead are no longer what the table holds
        return await pgraw.codec(table).guarded_update(raw, key, version, values)
    column, value = key
    statement = _statement(table, column, tuple(sorted(values)))
    params = {f"v_{k}": v for k, v in values.items()} | {"k_key": value, "k_version": version}
    result = await conn.execute(statement, params)
    return bool(result.rowcount == 1)


async def guarded_update_many(
    conn: AsyncConnection,
    table: sa.Table,
    column: str,
    rows: Sequence[tuple[Any, int, dict[str, Any]]],
) -> set[Any]:
    """``guarded_update`` of many rows, each (key, version, values), every ``values`` with the
    same columns; the keys whose row matched. On PostgreSQL one statement (one round trip);
    elsewhere one update each."""
    raw = pgraw.pg(conn)
    if raw is not None:
        if table.name in pgraw.READ_AHEAD_TABLES:
            pgraw.forget_read_ahead(conn)
        return await pgraw.codec(table).guarded_update_many(raw, column, rows)
    return {
        key
        for key, version, values in rows
        if await guarded_update(conn, table, (column, key), version, values)
    }


@functools.lru_cache(maxsize=512)
def _statement(table: sa.Table, column: str, names: tuple[str, ...]) -> sa.Update:
    """The UPDATE for one set of columns, built once: building it costs more than running it."""
    return (
        sa.update(table)
        .where(
            table.c[column] == sa.bindparam("k_key", type_=table.c[column].type),
            table.c.version == sa.bindparam("k_version", type_=table.c.version.type),
        )
        .values(
            {n: sa.bindparam(f"v_{n}", type_=table.c[n].type) for n in names}
            | {"version": table.c.version + 1}
        )
    )
