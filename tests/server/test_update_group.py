"""Agents' allocation updates share group commits, and each still gets its own verdict."""

from __future__ import annotations

import asyncio

import pytest
from server_harness import World

from corral.core.errors import Conflict
from corral.core.events import EventKind
from corral.core.states import JobState
from corral.server.agentlink.base import Ack
from corral.server.services.unit import Tx

pytestmark = pytest.mark.anyio


async def test_updates_from_two_agents_share_commits_and_each_lands(world: World) -> None:
    jobs = [await world.submit(resources={"gpus": 1}) for _ in range(4)]
    agents = [await world.agent("n1", gpus=2), await world.agent("n2", gpus=2)]
    await world.cycle()
    given = [(ag, await ag.next_assignment()) for ag in agents for _ in range(2)]
    before = world.plane.agents.updates.groups

    acks = await asyncio.gather(*(ag.start(a) for ag, a in given))
    done = await asyncio.gather(
        *(ag.finish(a, {a.jobs[0].job_id: {"out.txt": b"ok"}}) for ag, a in given)
    )

    assert list(acks) == [Ack.ACCEPTED] * 4
    assert list(done) == [Ack.ACCEPTED] * 4
    assert world.plane.agents.updates.groups - before < 8, "concurrent updates share commits"
    for job in jobs:
        rec = await world.job(job.job.id)
        assert rec.state is JobState.SUCCEEDED
        assert [f.name for f in rec.result] == ["out.txt"]
        assert (await world.kinds(job.job.id))[-2:] == ["job.started", "job.succeeded"]


async def test_a_stale_update_in_a_group_does_not_spoil_the_others(world: World) -> None:
    first, second = (
        await world.submit(resources={"gpus": 1}),
        await world.submit(resources={"gpus": 1}),
    )
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    a, b = await agent.next_assignment(), await agent.next_assignment()
    stale = world.plane.agents.started("n1", a.allocation_id, a.attempt + 1)

    acks = await asyncio.gather(stale, agent.start(a), agent.start(b))

    assert list(acks) == [Ack.STALE, Ack.ACCEPTED, Ack.ACCEPTED]
    for job in (first, second):
        assert (await world.job(job.job.id)).state is JobState.RUNNING


async def test_a_unit_that_raises_reruns_its_group_and_effects_count_once(world: World) -> None:
    group = world.plane.agents.updates
    counted: list[str] = []

    async def good(tx: Tx) -> str:
        tx.emit(EventKind.JOB_LOG, team=None, lines=["kept"])
        tx.count(lambda: counted.append("good"))
        return "ok"

    async def bad(tx: Tx) -> str:
        tx.emit(EventKind.JOB_LOG, team=None, lines=["dropped"])
        tx.count(lambda: counted.append("bad"))
        raise Conflict("this unit fails")

    results = await asyncio.gather(
        group.run(good), group.run(bad), group.run(good), return_exceptions=True
    )

    assert results[0] == "ok"
    assert isinstance(results[1], Conflict)
    assert results[2] == "ok"
    assert counted == ["good", "good"], "effects run after the commit, once, for kept units only"
    lines = [e.data["lines"] for e in await world.events() if e.kind is EventKind.JOB_LOG]
    assert lines == [["kept"], ["kept"]]


async def test_a_submission_and_an_agents_update_share_one_transaction(world: World) -> None:
    running = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    a = await agent.next_assignment()
    writes = world.plane.jobs.group
    assert writes is world.plane.agents.updates, "one writer queue for both"
    world.plane.rt.schedule_needed.clear()
    before = writes.groups

    ack, queued = await asyncio.gather(
        world.plane.agents.started("n1", a.allocation_id, a.attempt),
        world.submit(resources={"gpus": 1}),
    )

    assert ack is Ack.ACCEPTED
    assert writes.groups - before == 1, "the start and the submission committed together"
    assert (await world.job(running.job.id)).state is JobState.RUNNING
    assert (await world.job(queued.job.id)).state is JobState.QUEUED
    assert world.plane.rt.schedule_needed.fired, "the submission asks for a cycle"


async def test_an_update_alone_does_not_ask_for_a_cycle(world: World) -> None:
    await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    a = await agent.next_assignment()
    world.plane.rt.schedule_needed.clear()

    assert await world.plane.agents.started("n1", a.allocation_id, a.attempt) is Ack.ACCEPTED

    assert not world.plane.rt.schedule_needed.fired, "a start frees nothing"


async def test_a_start_and_end_in_one_group_behind_a_submission_keep_their_order(
    world: World,
) -> None:
    """A group runs agents' reports before submissions (their events need no fsync), but an
    agent's start (relaxed) and its end (early) stay in the order they came."""
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=1)
    await world.cycle()
    a = await agent.next_assignment()
    group = world.plane.agents.updates
    before = group.groups
    later = world.submit(resources={"gpus": 1})  # a durable unit, queued first

    _, started, ended = await asyncio.gather(
        later, agent.start(a), agent.finish(a, {job.job.id: {"out.txt": b"ok"}})
    )

    assert group.groups - before == 1, "the three shared one group"
    assert (started, ended) == (Ack.ACCEPTED, Ack.ACCEPTED)
    rec = await world.job(job.job.id)
    assert rec.state is JobState.SUCCEEDED
    assert rec.started_at is not None
    assert (await world.kinds(job.job.id))[-2:] == ["job.started", "job.succeeded"]
