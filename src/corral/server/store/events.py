"""The append-only ``events`` table: it feeds SSE streams, audit and trace export."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.events import Event, EventKind
from corral.server.store.tables import events


@dataclass(frozen=True, slots=True)
class TeamEvent:
    """An event to append, with the team that may read it (None: admins only)."""

    event: Event
    team: str | None = None


async def append(conn: AsyncConnection, batch: Sequence[TeamEvent]) -> None:
    if not batch:
        return
    await conn.execute(
        sa.insert(events),
        [
            {
                "kind": te.event.kind.value,
                "at": te.event.at,
                "job_id": te.event.job_id,
                "node": te.event.node,
                "team": te.team,
                "data": dict(te.event.data),
            }
            for te in batch
        ],
    )


async def after(
    conn: AsyncConnection,
    seq: int,
    *,
    job_id: str | None = None,
    team: str | None = None,
    limit: int = 500,
) -> list[tuple[Event, str | None]]:
    """Events with ``seq`` greater than ``seq``, oldest first, with their team."""
    query = sa.select(events).where(events.c.seq > seq).order_by(events.c.seq).limit(limit)
    if job_id is not None:
        query = query.where(events.c.job_id == job_id)
    if team is not None:
        query = query.where(events.c.team == team)
    rows = await conn.execute(query)
    return [
        (Event(EventKind(r.kind), r.at, r.job_id, r.node, r.data or {}, r.seq), r.team)
        for r in rows
    ]


async def last_seq(conn: AsyncConnection) -> int:
    return int((await conn.execute(sa.select(sa.func.max(events.c.seq)))).scalar() or 0)
