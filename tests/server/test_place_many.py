"""A cycle's single-job placements go in together (``placement._place_lone``): one guarded
update of their jobs and one insert of their allocations, each placement still standing or
falling on its own. On SQLite and PostgreSQL (where it is one round trip each)."""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.events import EventKind
from corral.core.model import Job
from corral.core.states import JobState
from corral.scheduler.api import Placement, Plan
from corral.server.services.placement import apply_plan
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store.db import Database, parse_db
from corral.server.store.records import JobRecord

pytestmark = pytest.mark.anyio


async def test_update_many_moves_the_jobs_whose_version_matches(db_url: str) -> None:
    db = Database(parse_db(db_url))
    await db.prepare()
    try:
        async with db.write() as conn:
            for job_id in ("a", "b", "c"):
                await job_repo.insert(conn, JobRecord(job=Job(id=job_id)))
        async with db.write() as conn:
            seen = {j: await job_repo.get(conn, j) for j in ("a", "b", "c")}
        async with db.write() as conn:
            b = seen["b"]
            assert b is not None
            assert await job_repo.update(conn, b, progress=0.5)  # b moves on meanwhile
        changes = []
        for job_id, rec in seen.items():
            assert rec is not None
            values = {"node": f"n-{job_id}", "allocation_ids": [f"al-{job_id}"], "checkpoint": None}
            changes.append((rec, values))
        async with db.write() as conn:
            moved = await job_repo.update_many(conn, changes)
            assert await job_repo.update_many(conn, []) == set()
        assert moved == {"a", "c"}
        async with db.read() as conn:
            after = {j: await job_repo.get(conn, j) for j in ("a", "b", "c")}
        a, b2, c = after["a"], after["b"], after["c"]
        assert a is not None
        assert b2 is not None
        assert c is not None
        assert (a.node, a.allocation_ids, a.checkpoint, a.version) == ("n-a", ("al-a",), None, 2)
        assert (c.node, c.allocation_ids, c.version) == ("n-c", ("al-c",), 2)
        assert (b2.node, b2.progress, b2.version) == (None, 0.5, 2), "b kept its own change"
    finally:
        await db.close()


def _one(job_ids: tuple[str, ...], node: str, gpu: int, replica: int = 0) -> Placement:
    return Placement(f"p-{job_ids[0]}-{replica}", job_ids, node, replica, (gpu,), 1000)


async def test_a_plan_places_each_job_alone_and_skips_the_stale_one_in_order(
    world: World,
) -> None:
    a, b, c = [await world.submit(resources={"gpus": 1}) for _ in range(3)]
    gang = await world.submit(resources={"gpus": 1}, replicas=2, kind="train")
    n1 = await world.agent("n1", gpus=4)
    n2 = await world.agent("n2", gpus=1)
    seen = {r.job.id: await world.job(r.job.id) for r in (a, b, c, gang)}
    await world.plane.jobs.cancel(ADMIN, b.job.id)  # after the snapshot, before the plan
    g = gang.job.id
    plan = Plan(
        placements=(
            _one((a.job.id,), "n1", 0),
            _one((b.job.id,), "n1", 1),
            _one((g,), "n1", 2, replica=0),
            _one((g,), "n2", 0, replica=1),
            _one((c.job.id,), "n1", 3),
        )
    )
    before = max(e.seq for e in await world.events())
    applied = await apply_plan(world.plane.rt, plan, seen)

    assert applied.stale == 1
    placed = {x.jobs[0].job_id for x in applied.placed}
    assert placed == {a.job.id, c.job.id, g}
    states = {r: (await world.job(r)).state for r in seen}
    assert states == {
        a.job.id: JobState.PLACED,
        b.job.id: JobState.CANCELLED,
        c.job.id: JobState.PLACED,
        g: JobState.PLACED,
    }
    order = [
        e.job_id for e in await world.events() if e.seq > before and e.kind is EventKind.JOB_PLACED
    ]
    assert order == [a.job.id, g, c.job.id], "events in the plan's order"
    async with world.plane.rt.db.read() as conn:
        for x in applied.placed:
            rec = await alloc_repo.get(conn, x.allocation_id)
            assert rec is not None
            assert rec.alloc.node == x.node
    to_n1 = [(await n1.next_assignment()).jobs[0].job_id for _ in range(3)]
    assert sorted(to_n1) == sorted([a.job.id, g, c.job.id])
    assert (await n2.next_assignment()).jobs[0].job_id == g
    job_a = await world.job(a.job.id)
    assert (job_a.job.attempt, job_a.node, job_a.allocation_ids) == (
        1,
        "n1",
        tuple(x.allocation_id for x in applied.placed if x.jobs[0].job_id == a.job.id),
    )
