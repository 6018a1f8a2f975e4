"""Queries on ``autoscale_machines``: the autoscaler's ledger (``corral.autoscaler.ledger``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.autoscaler.ledger import Launched
from corral.server.store.tables import autoscale_machines as table

_COLUMNS = tuple(f.name for f in fields(Launched))


async def insert(conn: AsyncConnection, rows: Sequence[Launched]) -> None:
    if rows:
        await conn.execute(sa.insert(table), [_values(x) for x in rows])


async def recent(conn: AsyncConnection, since: float) -> list[Launched]:
    """Every open entry, and those that ended at ``since`` or later (for back-off and spend)."""
    query = sa.select(table).where(sa.or_(table.c.ended_at.is_(None), table.c.ended_at >= since))
    rows = await conn.execute(query.order_by(table.c.asked_at, table.c.name))
    return [_launched(row) for row in rows]


async def mark(conn: AsyncConnection, names: Iterable[str], **values: Any) -> None:
    """Set ``values`` (sent, listed, joined) on the open entries ``names``."""
    wanted = sorted(names)
    if wanted:
        await conn.execute(
            sa.update(table)
            .where(table.c.name.in_(wanted), table.c.ended_at.is_(None))
            .values(**values)
        )


async def end(
    conn: AsyncConnection, names: Iterable[str], at: float, outcome: str, why: str
) -> None:
    """End the open entries ``names``: they no longer count against caps (an ended one
    stays ended)."""
    await mark(conn, names, ended_at=at, outcome=outcome, reason=why[:512])


async def sweep(conn: AsyncConnection, before: float) -> int:
    """Delete entries that ended before ``before``; how many."""
    result = await conn.execute(sa.delete(table).where(table.c.ended_at < before))
    return int(result.rowcount or 0)


def _values(x: Launched) -> dict[str, Any]:
    return {name: getattr(x, name) for name in _COLUMNS}


def _launched(row: Any) -> Launched:
    return Launched(**{name: getattr(row, name) for name in _COLUMNS})
