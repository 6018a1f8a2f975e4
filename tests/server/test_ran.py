"""A start and an end reported together (``AgentInbound.ran``) do what the two reports do.

Work that ends at once reaches the server as one bundle holding its agent's
``started`` and ``finished``; the server handles the pair as one unit
(``AgentService.ran``). These tests hold it to the two separate calls: the
same rows, events, acks and verdicts on stale or repeated reports. Each runs
on SQLite and on PostgreSQL (the ``world`` fixture).
"""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import World

from corral.core.states import JobState
from corral.server.agentlink.base import Ack, Assignment
from corral.server.store import allocations as alloc_repo

pytestmark = pytest.mark.anyio


async def test_a_start_with_its_end_leaves_what_the_two_reports_leave(world: World) -> None:
    apart = await world.submit(resources={"gpus": 1})
    together = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    first, second = await agent.next_assignment(), await agent.next_assignment()
    by_job = {a.jobs[0].job_id: a for a in (first, second)}
    one, both = by_job[apart.job.id], by_job[together.job.id]
    world.clock.advance(5)

    assert await agent.start(one) is Ack.ACCEPTED
    assert await agent.finish(one, {apart.job.id: {"out.txt": b"ok"}}) is Ack.ACCEPTED
    acks = await agent.ran(both, {together.job.id: {"out.txt": b"ok"}})

    assert acks == (Ack.ACCEPTED, Ack.ACCEPTED)
    want, got = await world.job(apart.job.id), await world.job(together.job.id)
    assert got.state is want.state is JobState.SUCCEEDED
    assert got.started_at == want.started_at == world.clock.now()
    assert got.finished_at == want.finished_at
    assert [(f.name, f.size, f.sha256) for f in got.result] == [
        (f.name, f.size, f.sha256) for f in want.result
    ]
    assert await world.kinds(together.job.id) == await world.kinds(apart.job.id)
    assert await world.kinds(together.job.id) == [
        "job.submitted",
        "job.placed",
        "job.started",
        "job.succeeded",
    ]
    assert _event_data(await world.events(together.job.id)) == _event_data(
        await world.events(apart.job.id)
    )
    assert await _alloc_row(world, both) == await _alloc_row(world, one)
    registry = world.plane.rt.metrics.registry  # both runs observed, each 0 s long
    assert registry.get_sample_value("corral_job_run_seconds_count") == 2
    assert registry.get_sample_value("corral_job_run_seconds_sum") == 0


async def test_every_job_of_a_batch_starts_and_ends(world: World) -> None:
    jobs = await world.submit_many(
        [{"kind": "sample", "resources": {"gpus": 1}, "batch_key": "sd15"} for _ in range(3)]
    )
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    assert len(a.jobs) == 3

    assert await agent.ran(a) == (Ack.ACCEPTED, Ack.ACCEPTED)

    for job in jobs:
        rec = await world.job(job.job.id)
        assert rec.state is JobState.SUCCEEDED
        assert rec.started_at == world.clock.now()
        assert [f.name for f in rec.result] == ["out.txt"]
        assert (await world.kinds(job.job.id))[-2:] == ["job.started", "job.succeeded"]


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("already started", (Ack.DUPLICATE, Ack.ACCEPTED)),
        ("already finished", (Ack.STALE, Ack.DUPLICATE)),
        ("older attempt", (Ack.STALE, Ack.STALE)),
        ("another node", (Ack.UNKNOWN, Ack.UNKNOWN)),
    ],
)
async def test_the_acks_are_the_two_reports_acks(
    world: World, case: str, want: tuple[Ack, Ack]
) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    node, attempt = "n1", a.attempt
    if case == "already started":
        await agent.start(a)
    elif case == "already finished":
        await agent.start(a)
        await agent.finish(a)
    elif case == "older attempt":
        attempt += 1
    else:
        node = "n2"
    events_before = len(await world.events(job.job.id))

    acks = await world.plane.agents.ran(node, a.allocation_id, attempt, [])

    assert acks == want
    separately = (
        await world.plane.agents.started(node, a.allocation_id, attempt),
        await world.plane.agents.finished(node, a.allocation_id, attempt, []),
    )
    if case != "already started":  # there, the first call finished the job meanwhile
        assert separately == want
    kinds = await world.kinds(job.job.id)
    if case == "already started":
        assert kinds.count("job.started") == 1
        assert kinds[-1] == "job.succeeded"
    else:
        assert len(kinds) == events_before, "a refused report changes nothing"


async def test_a_gang_replica_that_ran_starts_the_job_and_waits_for_the_others(
    world: World,
) -> None:
    job = await world.submit(resources={"gpus": 1}, replicas=2, kind="train")
    n1, n2 = await world.agent("n1"), await world.agent("n2")
    await world.cycle()
    r1, r2 = await n1.next_assignment(), await n2.next_assignment()

    assert await n1.ran(r1) == (Ack.ACCEPTED, Ack.ACCEPTED)
    running = await world.job(job.job.id)
    assert running.state is JobState.RUNNING, "the whole gang has not finished yet"
    assert running.started_at == world.clock.now()
    assert len(running.result) == 1

    assert await n2.ran(r2) == (Ack.ACCEPTED, Ack.ACCEPTED)
    done = await world.job(job.job.id)
    assert done.state is JobState.SUCCEEDED
    assert len(done.result) == 2
    kinds = await world.kinds(job.job.id)
    assert kinds.count("job.started") == 1
    assert kinds[-1] == "job.succeeded"


def _event_data(events: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """The start's and the end's events (submission and placement name their own ids)."""
    return [(e.kind.value, dict(e.data), e.node) for e in events if e.kind.value in _REPORTED]


_REPORTED = ("job.started", "job.succeeded")


async def _alloc_row(world: World, a: Assignment) -> tuple[object, ...]:
    async with world.plane.rt.db.read() as conn:
        rec = await alloc_repo.get(conn, a.allocation_id)
    assert rec is not None
    alloc = rec.alloc
    return (alloc.observed, alloc.active, rec.ended_at, alloc.started_at)
