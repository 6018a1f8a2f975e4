"""Queries on the ``audit`` table: append a record, read a page, delete expired ones.

Nothing here updates a record (the table's trigger would refuse it): records are
appended in the transaction of the change they describe (``services/audit.py``)
and deleted only by the retention sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.tables import audit

PREFIX = ".*"
"""An action filter ending so (``job.*``) matches every action that starts with what precedes."""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One stored record: who (a token, or the server itself), what, when, from where."""

    seq: int
    at: float
    actor_id: str | None
    actor_kind: str
    actor_name: str
    actor_team: str | None
    action: str
    target: str
    detail: dict[str, Any]
    address: str | None
    forwarded_for: str | None


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which records a page holds; every field given must match."""

    actor: str | None = None  # a token's id or name
    team: str | None = None  # the actor's team
    actions: tuple[str, ...] = ()  # any of these (``job.*``: every job action)
    target: str | None = None
    since: float | None = None  # at or after
    until: float | None = None  # before


async def append(conn: AsyncConnection, **values: Any) -> None:
    await conn.execute(sa.insert(audit).values(**values))


async def page(
    conn: AsyncConnection, where: AuditFilter, before_seq: int | None, limit: int
) -> list[AuditRecord]:
    """Up to ``limit`` records matching ``where``, newest first, older than ``before_seq``."""
    query = sa.select(audit).where(*_conditions(where))
    if before_seq is not None:
        query = query.where(audit.c.seq < before_seq)
    rows = await conn.execute(query.order_by(audit.c.seq.desc()).limit(limit))
    return [AuditRecord(**row._mapping) for row in rows]


def _conditions(where: AuditFilter) -> list[sa.ColumnElement[bool]]:
    out: list[sa.ColumnElement[bool]] = []
    if where.actor is not None:
        out.append(sa.or_(audit.c.actor_id == where.actor, audit.c.actor_name == where.actor))
    if where.team is not None:
        out.append(audit.c.actor_team == where.team)
    if where.actions:
        exact = [a for a in where.actions if not a.endswith(PREFIX)]
        starts = [a.removesuffix(PREFIX) + "." for a in where.actions if a.endswith(PREFIX)]
        out.append(
            sa.or_(
                audit.c.action.in_(exact),
                *(audit.c.action.startswith(s, autoescape=True) for s in starts),
            )
        )
    if where.target is not None:
        out.append(audit.c.target == where.target)
    if where.since is not None:
        out.append(audit.c.at >= where.since)
    if where.until is not None:
        out.append(audit.c.at < where.until)
    return out


async def delete_before(conn: AsyncConnection, cutoff: float, limit: int) -> int:
    """Delete up to ``limit`` of the oldest records made before ``cutoff``; how many."""
    oldest = sa.select(audit.c.seq).where(audit.c.at < cutoff).order_by(audit.c.seq).limit(limit)
    result = await conn.execute(sa.delete(audit).where(audit.c.seq.in_(oldest.scalar_subquery())))
    return result.rowcount or 0
