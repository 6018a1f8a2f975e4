"""Guarded updates: change a row only if nobody changed it since we read it."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection


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
    result = await conn.execute(
        sa.update(table)
        .where(table.c[column] == value, table.c.version == version)
        .values(**values, version=table.c.version + 1)
    )
    return bool(result.rowcount == 1)
