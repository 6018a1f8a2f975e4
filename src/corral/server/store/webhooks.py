"""Queries on the webhook tables (``services/webhooks.py``): the events cursor,
deliveries and the teams' secrets, and the events of jobs whose pipeline or array
names a webhook. Off the job path: plain SQLAlchemy."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.tables import (
    events,
    job_groups,
    jobs,
    webhook_cursor,
    webhook_deliveries,
    webhook_secrets,
)

CURSOR = "events"
PENDING = "pending"


@dataclass(frozen=True, slots=True)
class HookedEvent:
    """An event of a job that names a webhook."""

    seq: int
    kind: str
    at: float
    job_id: str
    data: dict[str, Any]
    team: str
    url: str
    events: str  # end | all


async def cursor(conn: AsyncConnection) -> int | None:
    """The last event turned into deliveries (None: never started)."""
    query = sa.select(webhook_cursor.c.seq).where(webhook_cursor.c.name == CURSOR)
    value = (await conn.execute(query)).scalar()
    return None if value is None else int(value)


async def start_cursor(conn: AsyncConnection, seq: int) -> None:
    await conn.execute(sa.insert(webhook_cursor).values(name=CURSOR, seq=seq))


async def move_cursor(conn: AsyncConnection, old: int, new: int) -> bool:
    """Compare and set: False when another writer moved it (it made those deliveries)."""
    result = await conn.execute(
        sa.update(webhook_cursor)
        .where(webhook_cursor.c.name == CURSOR, webhook_cursor.c.seq == old)
        .values(seq=new)
    )
    return bool(result.rowcount == 1)


async def last_event(conn: AsyncConnection) -> int:
    value = (await conn.execute(sa.select(sa.func.max(events.c.seq)))).scalar()
    return int(value or 0)


async def next_event(conn: AsyncConnection, after: int) -> int | None:
    """The first event after ``after`` (numbers jump at each start: gaps are skipped)."""
    query = sa.select(sa.func.min(events.c.seq)).where(events.c.seq > after)
    value = (await conn.execute(query)).scalar()
    return None if value is None else int(value)


async def hooked_events(
    conn: AsyncConnection, after: int, upto: int, kinds: Collection[str]
) -> list[HookedEvent]:
    """Events in ``(after, upto]`` of ``kinds`` whose job names a webhook, in order."""
    query = (
        sa.select(
            events.c.seq,
            events.c.kind,
            events.c.at,
            events.c.job_id,
            events.c.data,
            jobs.c.team,
            jobs.c.webhook_url,
            jobs.c.webhook_events,
        )
        .join(jobs, jobs.c.id == events.c.job_id)
        .where(
            events.c.seq > after,
            events.c.seq <= upto,
            events.c.kind.in_(sorted(kinds)),
            jobs.c.webhook_url.is_not(None),
        )
        .order_by(events.c.seq)
    )
    return [
        HookedEvent(r.seq, r.kind, r.at, r.job_id, dict(r.data or {}), r.team, r.webhook_url,
                    r.webhook_events or "end")
        for r in await conn.execute(query)
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """An event of a job whose pipeline or array names a webhook."""

    seq: int
    kind: str
    at: float
    job_id: str
    data: dict[str, Any]
    group_id: str
    group_kind: str  # pipeline | array
    team: str
    url: str
    events: str  # end | all


async def group_events(
    conn: AsyncConnection, after: int, upto: int, kinds: Collection[str]
) -> list[GroupEvent]:
    """Events in ``(after, upto]`` of ``kinds`` whose job's group names a webhook, in order."""
    g = job_groups
    query = (
        sa.select(
            events.c.seq, events.c.kind, events.c.at, events.c.job_id, events.c.data,
            g.c.id, g.c.kind.label("group_kind"), g.c.team, g.c.webhook_url, g.c.webhook_events,
        )
        .join(jobs, jobs.c.id == events.c.job_id)
        .join(g, g.c.id == jobs.c.group_id)
        .where(
            events.c.seq > after,
            events.c.seq <= upto,
            events.c.kind.in_(sorted(kinds)),
            g.c.webhook_url.is_not(None),
        )
        .order_by(events.c.seq)
    )  # fmt: skip
    return [
        GroupEvent(r.seq, r.kind, r.at, r.job_id, dict(r.data or {}), r.id, r.group_kind,
                   r.team, r.webhook_url, r.webhook_events or "end")
        for r in await conn.execute(query)
    ]  # fmt: skip


async def group_jobs(conn: AsyncConnection, group_id: str) -> list[tuple[str, str]]:
    """(id, state) of each job of the group, in submission order."""
    query = (
        sa.select(jobs.c.id, jobs.c.state).where(jobs.c.group_id == group_id).order_by(jobs.c.seq)
    )
    return [(r.id, r.state) for r in await conn.execute(query)]


async def group_counts(conn: AsyncConnection, group_id: str) -> dict[str, int]:
    """The group's jobs by state (counted in the database: an array may hold 100,000)."""
    query = (
        sa.select(jobs.c.state, sa.func.count())
        .where(jobs.c.group_id == group_id)
        .group_by(jobs.c.state)
    )
    return {state: int(n) for state, n in await conn.execute(query)}


async def job_states(conn: AsyncConnection, ids: Collection[str]) -> dict[str, str]:
    query = sa.select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(sorted(ids)))
    return {r.id: r.state for r in await conn.execute(query)}


async def last_group_event(conn: AsyncConnection, group_id: str, kinds: Collection[str]) -> int:
    """The newest event of ``kinds`` of any job of the group (0: none)."""
    query = (
        sa.select(sa.func.max(events.c.seq))
        .join(jobs, jobs.c.id == events.c.job_id)
        .where(jobs.c.group_id == group_id, events.c.kind.in_(sorted(kinds)))
    )
    return int((await conn.execute(query)).scalar() or 0)


async def group_team(conn: AsyncConnection, group_id: str) -> str | None:
    """The team of the pipeline or array (None: there is none)."""
    query = sa.select(job_groups.c.team).where(job_groups.c.id == group_id)
    value = (await conn.execute(query)).scalar()
    return None if value is None else str(value)


async def pending_by_team(conn: AsyncConnection, teams: Collection[str]) -> dict[str, int]:
    query = (
        sa.select(webhook_deliveries.c.team, sa.func.count())
        .where(webhook_deliveries.c.team.in_(sorted(teams)), webhook_deliveries.c.state == PENDING)
        .group_by(webhook_deliveries.c.team)
    )
    return {team: int(n) for team, n in await conn.execute(query)}


async def insert(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        await conn.execute(sa.insert(webhook_deliveries), list(rows))


async def due(conn: AsyncConnection, now: float, limit: int) -> list[Any]:
    """Pending deliveries due by ``now``, the longest waiting first."""
    t = webhook_deliveries
    query = (
        sa.select(t)
        .where(t.c.state == PENDING, t.c.next_at <= now)
        .order_by(t.c.next_at, t.c.id)
        .limit(limit)
    )
    return list(await conn.execute(query))


async def update(conn: AsyncConnection, delivery_id: str, version: int, **values: Any) -> bool:
    """Guarded by ``version``: False when another sender changed it since it was read."""
    t = webhook_deliveries
    result = await conn.execute(
        sa.update(t)
        .where(t.c.id == delivery_id, t.c.version == version)
        .values(**values, version=t.c.version + 1)
    )
    return bool(result.rowcount == 1)


async def of_subject(conn: AsyncConnection, subject: str, limit: int) -> list[Any]:
    t = webhook_deliveries
    query = sa.select(t).where(t.c.subject == subject).order_by(t.c.event_seq).limit(limit)
    return list(await conn.execute(query))


async def secret(conn: AsyncConnection, team: str) -> str | None:
    query = sa.select(webhook_secrets.c.secret).where(webhook_secrets.c.team == team)
    value = (await conn.execute(query)).scalar()
    return None if value is None else str(value)


async def put_secret(conn: AsyncConnection, team: str, value: str, at: float) -> None:
    """Set ``team``'s secret (insert or replace)."""
    t = webhook_secrets
    changed = await conn.execute(sa.update(t).where(t.c.team == team).values(secret=value))
    if changed.rowcount == 0:
        await conn.execute(sa.insert(t).values(team=team, secret=value, created_at=at))
