"""The jobs list's query: newest first, filtered, a page at a time by keyset.

Each page continues below the last ``seq`` seen (the cursor), so page 2,000 costs
what page 1 does however many jobs the table holds: the query walks the primary key
(or the ``state``, ``team``, ``user``, ``node`` or ``model`` index, each ending in
``seq``) downwards and stops after ``limit`` matches. Filters on other columns (kind,
priority, time, id prefix) are checked along that walk: most jobs match one of them
or the walk is short (``bench/job_list.py`` measures each at 100,000 jobs).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.states import JobState
from corral.server.store.records import JobRecord, job_from_row
from corral.server.store.tables import jobs


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What a listing keeps; every field unset keeps all."""

    states: Collection[JobState] = ()
    team: str | None = None
    user: str | None = None
    kind: str | None = None
    priority: str | None = None
    node: str | None = None  # where it runs or last ran
    model: str | None = None  # the registry model it asks for
    since: float | None = None  # submitted at or after (epoch seconds)
    until: float | None = None  # submitted before
    id_prefix: str | None = None
    interrupted: bool | None = None


async def page(
    conn: AsyncConnection, f: JobFilter, *, before_seq: int | None, limit: int
) -> list[JobRecord]:
    """Up to ``limit`` jobs matching ``f``, newest first, below ``before_seq``."""
    query = sa.select(jobs).order_by(jobs.c.seq.desc()).limit(limit)
    for clause in _clauses(f):
        query = query.where(clause)
    if before_seq is not None:
        query = query.where(jobs.c.seq < before_seq)
    return [job_from_row(r) for r in await conn.execute(query)]


def _clauses(f: JobFilter) -> list[sa.ColumnElement[bool]]:
    out: list[sa.ColumnElement[bool]] = []
    if f.states:
        out.append(jobs.c.state.in_([s.value for s in f.states]))
    equal = {"team": f.team, "user": f.user, "kind": f.kind, "priority": f.priority}
    out += [jobs.c[name] == value for name, value in equal.items() if value is not None]
    if f.node is not None:
        out.append(jobs.c.node == f.node)
    if f.model is not None:
        out.append(jobs.c.model == f.model)
    if f.since is not None:
        out.append(jobs.c.submitted_at >= f.since)
    if f.until is not None:
        out.append(jobs.c.submitted_at < f.until)
    if f.id_prefix:  # LIKE's wildcards in the prefix match themselves
        escaped = f.id_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        out.append(jobs.c.id.like(escaped + "%", escape="\\"))
    if f.interrupted is not None:
        out.append(jobs.c.interrupted == f.interrupted)
    return out
