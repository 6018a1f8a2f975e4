"""Allocations kept as placed (``Runtime.placed_allocs``) for the agent's first report.

An agent's start or end reads its allocation back inside its unit; on SQLite the
record the placement inserted is taken instead when the row's version is still its
own (``alloc_repo.get(..., hint=...)``). These tests hold the hint to what a read
of the row gives, and make sure a hint whose row moved on is never returned.
"""

from __future__ import annotations

import pytest
from server_harness import World

from corral.core.states import JobState
from corral.server.agentlink.base import Ack
from corral.server.services import unit
from corral.server.store import allocations as alloc_repo
from corral.server.store.records import AllocRecord

pytestmark = pytest.mark.anyio


async def _read(world: World, alloc_id: str, hint: AllocRecord | None = None) -> AllocRecord:
    async with world.plane.rt.db.read() as conn:
        rec = await alloc_repo.get(conn, alloc_id, hint=hint)
    assert rec is not None
    return rec


async def test_a_placed_allocation_is_kept_as_its_row_reads(world: World) -> None:
    jobs = [await world.submit(resources={"gpus": 1}) for _ in range(3)]
    await world.agent("n1", gpus=4)
    await world.cycle()
    kept = world.plane.rt.placed_allocs
    assert len(kept) == 3
    assert sorted(j for r in kept.values() for j in r.alloc.job_ids) == sorted(
        j.job.id for j in jobs
    )
    for alloc_id, hint in kept.items():
        assert await _read(world, alloc_id) == hint  # every field, as a read decodes it


async def test_the_hint_is_taken_only_while_the_row_is_at_its_version(world: World) -> None:
    await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=1)
    await world.cycle()
    a = await agent.next_assignment()
    hint = world.plane.rt.placed_allocs[a.allocation_id]
    got = await _read(world, a.allocation_id, hint)
    if world.plane.rt.db.is_postgres:
        assert got == hint  # read with its jobs in one round trip: the hint is not used
    else:
        assert got is hint  # the version matched: no row read, no decode
    assert await agent.start(a) is Ack.ACCEPTED  # the report takes the hint, bumps the version
    assert a.allocation_id not in world.plane.rt.placed_allocs
    moved = await _read(world, a.allocation_id, hint)
    assert moved is not hint
    assert moved.version == hint.version + 1
    assert moved.alloc.started_at > 0


async def test_an_end_with_a_stale_hint_reads_the_row(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=1)
    await world.cycle()
    a = await agent.next_assignment()
    stale = world.plane.rt.placed_allocs[a.allocation_id]
    assert await agent.start(a) is Ack.ACCEPTED
    world.plane.rt.placed_allocs[a.allocation_id] = stale  # as if kept past the start
    assert await agent.finish(a, {job.job.id: {"out.txt": b"ok"}}) is Ack.ACCEPTED
    done = await world.job(job.job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.started_at is not None  # the start the stale hint did not know of


async def test_the_oldest_hints_go_first_past_the_bound(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unit, "PLACED_ALLOCS_MAX", 2)
    for _ in range(3):
        await world.submit(resources={"gpus": 1})
    await world.agent("n1", gpus=1)
    placed = []
    for _ in range(3):
        applied = await world.cycle()
        placed.extend(a.allocation_id for a in applied.placed)
        kept = list(world.plane.rt.placed_allocs)
        assert kept == placed[-2:]
        # Free the GPU for the next job: its agent never reports, the hint stays.
        async with world.plane.rt.db.write() as conn:
            rec = await alloc_repo.get(conn, kept[-1])
            assert rec is not None
            assert await alloc_repo.update(conn, rec, active=False)
