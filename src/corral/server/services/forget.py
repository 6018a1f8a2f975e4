"""Deleting finished jobs with everything they left: their rows, events, ended allocations,
result files and previews. Used by the retention sweep (``loops/retention.py``) and by
``DELETE /v1/jobs/{id}``.

Files go before rows: a deletion cut off between the two leaves a finished job whose files
are already gone (deleting it again finishes the work), never a file that nothing refers to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import InvalidSpec
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.previews import preview_folder
from corral.server.services.unit import Runtime
from corral.server.store import retention as repo
from corral.server.store.retention import JobAge
from corral.server.store.tables import job_groups, jobs, webhook_deliveries

log = logging.getLogger("corral.server.retention")


@dataclass
class Forgotten:
    """What was deleted."""

    jobs: int = 0
    events: int = 0
    previews: int = 0  # preview files
    results: int = 0  # result files (those too large to ride in the job row)
    audit: int = 0  # audit records (``retention.audit_s``)
    inputs: int = 0  # input files of an owner (``inputs.retention_s``)

    def __bool__(self) -> bool:
        return any((self.jobs, self.events, self.previews, self.results, self.audit, self.inputs))

    def add(self, other: Forgotten) -> None:
        self.jobs += other.jobs
        self.events += other.events
        self.previews += other.previews
        self.results += other.results
        self.audit += other.audit


async def forget(rt: Runtime, jobs: Sequence[JobAge], by: Principal | None = None) -> Forgotten:
    """Delete the finished ``jobs`` (others are left alone) and what they left.

    ``by``: the token that asked (``DELETE /v1/jobs/{id}``), recorded in the audit log with
    each deletion; the retention sweep's own deletions are not recorded (its setting is).
    """
    done = Forgotten()
    finished = [j for j in jobs if j.state in repo.TERMINAL]
    if not finished:
        return done
    for job in finished:
        done.results += await delete_tree(rt, f"results/{job.id}")
        done.previews += await delete_tree(rt, preview_folder(job.id))
    async with rt.tx() as tx:
        groups = await _groups_of(tx.conn, [j.id for j in finished])
        done.jobs, done.events = await repo.delete_jobs(tx.conn, finished)
        await _drop_empty_groups(tx.conn, groups)
        if by is not None and done.jobs:
            for job in finished:
                await audit.record(tx, by, "job.delete", job.id, {"state": job.state})
    return done


async def _groups_of(conn: AsyncConnection, job_ids: Sequence[str]) -> list[str]:
    """The pipelines and arrays these jobs belong to."""
    query = sa.select(jobs.c.group_id).where(jobs.c.id.in_(job_ids), jobs.c.group_id.is_not(None))
    return sorted({row.group_id for row in await conn.execute(query)})


async def _drop_empty_groups(conn: AsyncConnection, groups: Sequence[str]) -> None:
    """Forget a pipeline or array once its last job is gone, with its webhook's deliveries."""
    if not groups:
        return
    left = sa.select(jobs.c.id).where(jobs.c.group_id == job_groups.c.id).exists()
    gone = await conn.execute(
        sa.delete(job_groups).where(job_groups.c.id.in_(groups), ~left).returning(job_groups.c.id)
    )
    ids = [row[0] for row in gone]
    if ids:
        t = webhook_deliveries
        await conn.execute(sa.delete(t).where(t.c.subject.in_(ids)))


async def delete_tree(rt: Runtime, prefix: str) -> int:
    """Delete the blob folder ``prefix``; how many files. A name the server would not have
    written (a folder someone else put there) is left alone."""
    try:
        return await rt.blobs.delete_tree(prefix)
    except InvalidSpec:
        log.warning("left %s alone (not a name the server writes)", prefix)
        return 0
