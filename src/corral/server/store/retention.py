"""Queries of the retention sweep (``loops/retention.py``): finding and deleting old rows.

Not hot: plain SQLAlchemy on both databases. A job's events are found by the ``job_id``
index, and its allocations by the ids its ``job.placed`` events name (one per attempt):
deleting a job costs lookups, never a table scan.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.events import EventKind
from corral.core.states import JOB
from corral.server.store.records import JobRecord
from corral.server.store.tables import allocations, events, jobs, webhook_deliveries

TERMINAL = tuple(s.value for s in JOB.terminal)
DETAIL = (EventKind.JOB_PROGRESS.value, EventKind.JOB_PREVIEW.value)


@dataclass(frozen=True, slots=True)
class JobAge:
    """What the sweep needs to know of a job to decide whether it has expired."""

    seq: int
    id: str
    state: str
    submitted_at: float
    finished_at: float | None

    @classmethod
    def of(cls, rec: JobRecord) -> JobAge:
        """A job already read in full."""
        return cls(rec.seq, rec.job.id, rec.state.value, rec.job.submitted_at, rec.finished_at)

    def ended_before(self, cutoff: float) -> bool:
        return self.state in TERMINAL and self.finished_at is not None and self.finished_at < cutoff


_AGE = (
    jobs.c.seq,
    jobs.c.id,
    jobs.c.state,
    jobs.c.submitted_at,
    jobs.c.finished_at,
)


async def window(conn: AsyncConnection, after_seq: int, limit: int) -> list[JobAge]:
    """Up to ``limit`` jobs submitted after ``after_seq``, oldest first (a primary-key range)."""
    query = sa.select(*_AGE).where(jobs.c.seq > after_seq).order_by(jobs.c.seq).limit(limit)
    return [JobAge(*row) for row in await conn.execute(query)]


async def ages(conn: AsyncConnection, ids: Collection[str]) -> list[JobAge]:
    """The jobs of ``ids`` that exist."""
    if not ids:
        return []
    query = sa.select(*_AGE).where(jobs.c.id.in_(list(ids)))
    return [JobAge(*row) for row in await conn.execute(query)]


async def delete_jobs(conn: AsyncConnection, expired: Sequence[JobAge]) -> tuple[int, int]:
    """Delete finished jobs with their events and ended allocations; (jobs, events) deleted.

    Only rows still finished are touched: a job that is not (it cannot go back, but a bad
    caller could pass one) keeps everything.
    """
    ids = [j.id for j in expired if j.state in TERMINAL]
    if not ids:
        return 0, 0
    gone = await conn.execute(
        sa.delete(jobs).where(jobs.c.id.in_(ids), jobs.c.state.in_(TERMINAL)).returning(jobs.c.id)
    )
    deleted = [row[0] for row in gone]
    if not deleted:
        return 0, 0
    placed = await conn.execute(
        sa.select(events.c.data).where(
            events.c.job_id.in_(deleted), events.c.kind == EventKind.JOB_PLACED.value
        )
    )
    alloc_ids = sorted({a for (data,) in placed for a in (data or {}).get("allocations", ())})
    if alloc_ids:
        await conn.execute(
            sa.delete(allocations).where(
                allocations.c.id.in_(alloc_ids), allocations.c.active.is_(False)
            )
        )
    ev = await conn.execute(sa.delete(events).where(events.c.job_id.in_(deleted)))
    await conn.execute(
        sa.delete(webhook_deliveries).where(webhook_deliveries.c.subject.in_(deleted))
    )
    return len(deleted), ev.rowcount or 0


async def delete_detail(conn: AsyncConnection, job_ids: Collection[str]) -> int:
    """Delete the progress and preview events of ``job_ids``; how many."""
    if not job_ids:
        return 0
    result = await conn.execute(
        sa.delete(events).where(events.c.job_id.in_(list(job_ids)), events.c.kind.in_(DETAIL))
    )
    return result.rowcount or 0


async def delete_unattached_events(conn: AsyncConnection, before: float, limit: int) -> int:
    """Delete up to ``limit`` events of no job (nodes, teams) older than ``before``."""
    oldest = (
        sa.select(events.c.seq)
        .where(events.c.job_id.is_(None), events.c.at < before)
        .order_by(events.c.seq)
        .limit(limit)
    )
    result = await conn.execute(sa.delete(events).where(events.c.seq.in_(oldest.scalar_subquery())))
    return result.rowcount or 0
