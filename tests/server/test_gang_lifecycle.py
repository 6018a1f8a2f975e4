"""A gang as one distributed job, through the control plane with stub agents: where its
ranks meet, whose checkpoint counts, and how it stops and comes back as one."""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.rendezvous import ADDRESS_LABEL, PORTS
from corral.core.states import JobState, StopReason
from corral.scheduler.api import Plan, Preemption
from corral.server.agentlink.base import Ack, Assignment, StopOrder
from corral.server.agentlink.inprocess import StubAgent
from corral.server.services.placement import apply_plan

pytestmark = pytest.mark.anyio


async def placed_gang(
    world: World, **spec: object
) -> tuple[str, list[StubAgent], list[Assignment]]:
    """A gang of two on n1 and n2 (addresses 10.0.0.1 and .2), its replicas in rank order."""
    job = await world.submit(resources={"gpus": 1}, replicas=2, kind="train", **spec)
    agents = [await world.agent(f"n{i}", labels={ADDRESS_LABEL: f"10.0.0.{i}"}) for i in (1, 2)]
    await world.cycle()
    got = [(await a.next_assignment(), a) for a in agents]
    got.sort(key=lambda pair: pair[0].replica)
    return job.job.id, [a for _, a in got], [r for r, _ in got]


async def heard_for(world: World, agents: list[StubAgent], seconds: float) -> list[str]:
    """Let ``seconds`` pass with the agents heartbeating; the stragglers the ticks found."""
    found: list[str] = []
    for _ in range(int(seconds // 10)):
        for agent in agents:
            await agent.heartbeat()
        found += (await world.tick(after=10)).stragglers
    return found


async def stop_of(agent: StubAgent) -> StopOrder:
    order = await agent.receive()
    assert isinstance(order, StopOrder), order
    return order


async def test_every_replica_meets_at_replica_0s_node_on_one_port(world: World) -> None:
    _, agents, (r0, r1) = await placed_gang(world)
    master = f"10.0.0.{agents[0].node[1]}"
    assert (r0.replica, r1.replica, r0.replicas) == (0, 1, 2)
    assert (r0.master_addr, r1.master_addr) == (master, master)
    assert r0.master_port == r1.master_port in PORTS
    agents[1].disconnect()  # the assignment is sent again on its return: the same master
    reply = await agents[1].connect()
    (again,) = reply.assign
    assert (again.master_addr, again.master_port) == (master, r0.master_port)


async def test_a_lone_job_has_no_master(world: World) -> None:
    await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    assert (a.replicas, a.master_addr, a.master_port) == (1, "", 0)


async def test_rank_0s_checkpoint_is_the_gangs_and_every_rank_resumes_from_it(
    world: World,
) -> None:
    job_id, (n_a, n_b), (r0, r1) = await placed_gang(world)
    await n_a.start(r0)
    await n_b.start(r1)
    assert await n_b.checkpoint(r1, "ck/rank1", 5) is Ack.ACCEPTED
    assert (await world.job(job_id)).checkpoint is None, "only rank 0 writes the gang's"
    await n_a.checkpoint(r0, "ck/rank0", 10)
    await n_b.fail(r1, "exited with code 1", retryable=False)  # a peer's failure is the gang's
    rec = await world.job(job_id)
    assert (rec.state, rec.failures) == (JobState.QUEUED, 1)
    order = await stop_of(n_a)
    assert (order.allocation_id, order.reason) == (r0.allocation_id, StopReason.PREEMPT)
    await n_a.checkpoint(r0, "ck/rank0-last", 12)  # saved on its way out: kept
    await n_a.stopped(r0)
    assert ((await world.job(job_id)).checkpoint_step) == 12
    world.clock.advance(60)  # past the retry backoff
    await world.cycle()
    again = [await n_a.next_assignment(), await n_b.next_assignment()]
    assert {a.attempt for a in again} == {2}
    assert {(a.jobs[0].checkpoint, a.jobs[0].checkpoint_step) for a in again} == {
        ("ck/rank0-last", 12)
    }


async def test_a_replica_that_does_not_start_fails_the_attempt_not_the_cluster(
    world: World,
) -> None:
    job_id, (n_a, n_b), (r0, r1) = await placed_gang(world)
    await n_a.start(r0)
    timeout = world.plane.rt.settings.scheduling.gang_start_timeout_s
    assert await heard_for(world, [n_a, n_b], timeout - 10) == []
    assert await heard_for(world, [n_a, n_b], 20) == [r1.allocation_id]
    rec = await world.job(job_id)
    assert rec.state is JobState.QUEUED
    assert "replica 1 did not start within" in rec.attempt_errors[-1].error
    assert (await stop_of(n_b)).allocation_id == r1.allocation_id
    assert (await stop_of(n_a)).reason is StopReason.PREEMPT
    views = await world.plane.nodes.listing(ADMIN)
    assert {(v.record.node.name, v.record.node.schedulable) for v in views} == {
        ("n1", True),
        ("n2", True),
    }, "the nodes stay in service"


async def test_a_gang_preempted_whole_is_requeued_uncounted(world: World) -> None:
    job_id, (n_a, n_b), (r0, r1) = await placed_gang(world, priority="batch")
    await n_a.start(r0)
    await n_b.start(r1)
    preempt = tuple(
        Preemption(r.allocation_id, (job_id,), agent.node, "urgent", "reclaim")
        for r, agent in ((r0, n_a), (r1, n_b))
    )
    applied = await apply_plan(world.plane.rt, Plan(preemptions=preempt), {})
    assert sorted(applied.preempted) == sorted([r0.allocation_id, r1.allocation_id])
    assert (await stop_of(n_a)).reason is (await stop_of(n_b)).reason is StopReason.PREEMPT
    await n_a.checkpoint(r0, "ck/at-preempt", 30)
    await n_a.stopped(r0)
    await n_b.stopped(r1)
    rec = await world.job(job_id)
    assert (rec.state, rec.failures, rec.checkpoint) == (JobState.QUEUED, 0, "ck/at-preempt")


async def test_cancelling_a_gang_stops_every_replica(world: World) -> None:
    job_id, agents, replicas = await placed_gang(world)
    for agent, r in zip(agents, replicas, strict=True):
        await agent.start(r)
    await world.plane.jobs.cancel(ADMIN, job_id)
    for agent, r in zip(agents, replicas, strict=True):
        order = await stop_of(agent)
        assert (order.allocation_id, order.reason) == (r.allocation_id, StopReason.CANCEL)
        await agent.stopped(r)
    assert (await world.job(job_id)).state is JobState.CANCELLED


async def test_a_gang_requiring_its_label_waits_for_room_within_one_value(world: World) -> None:
    spec = {"gang_label": "rack", "gang_label_required": True}
    job = await world.submit(resources={"gpus": 1}, replicas=2, kind="train", **spec)
    assert (await world.job(job.job.id)).job.gang_label_required
    await world.agent("a1", labels={"rack": "r1"})
    b1 = await world.agent("b1", labels={"rack": "r2"})
    await world.cycle()
    assert (await world.job(job.job.id)).state is JobState.QUEUED, "never across racks"
    b2 = await world.agent("b2", labels={"rack": "r2"})
    await world.cycle()
    assert (await world.job(job.job.id)).state is JobState.PLACED
    placed = {(await b1.next_assignment()).replica, (await b2.next_assignment()).replica}
    assert placed == {0, 1}


async def test_the_gang_is_told_go_only_once_every_replica_is_ready(world: World) -> None:
    job_id, (n_a, n_b), (r0, r1) = await placed_gang(world)
    assert await n_a.ready(r0) is Ack.ACCEPTED
    assert (n_a.go, n_b.go) == ([], []), "replica 1 is still preparing: nobody launches"
    assert await n_a.ready(r0) is Ack.DUPLICATE  # resent after a reconnect: harmless
    assert await n_b.ready(r1) is Ack.ACCEPTED
    assert (n_a.go, n_b.go) == ([r0.allocation_id], [r1.allocation_id])
    assert (await world.job(job_id)).state is JobState.PLACED, "ready is not started"
    await n_a.start(r0)
    await n_b.start(r1)
    assert (await world.job(job_id)).state is JobState.RUNNING


async def test_a_ready_replica_waits_while_its_mate_straggles_then_is_stopped(
    world: World,
) -> None:
    job_id, (n_a, n_b), (r0, r1) = await placed_gang(world)
    await n_a.ready(r0)
    timeout = world.plane.rt.settings.scheduling.gang_start_timeout_s
    assert await heard_for(world, [n_a, n_b], timeout + 10) == [r1.allocation_id]
    assert n_a.go == [], "a gang missing a replica never launches"
    rec = await world.job(job_id)
    assert rec.state is JobState.QUEUED
    assert "replica 1 did not start within" in rec.attempt_errors[-1].error
    assert (await stop_of(n_a)).allocation_id == r0.allocation_id


async def test_a_lost_go_is_said_again_and_an_agent_without_two_phases_still_counts(
    world: World,
) -> None:
    _, (n_a, n_b), (r0, r1) = await placed_gang(world)
    await n_b.start(r1)  # an older agent: it starts at once, never says ready
    await n_a.ready(r0)
    assert n_a.go == [r0.allocation_id], "a replica running counts as ready"
    n_a.go.clear()  # the message died with the stream
    assert await world.plane.delivery.resync(older_than_s=0) >= 1
    assert n_a.go == [r0.allocation_id], "resync says go again while it waits"


async def test_a_resync_pass_says_go_again_to_every_ready_replica_of_a_gang(
    world: World,
) -> None:
    # Four replicas ready, every go lost with its stream: one pass says go to each again
    # (the gang read once for all four).
    await world.submit(resources={"gpus": 1}, replicas=4, kind="train")
    agents = [await world.agent(f"n{i}") for i in range(1, 5)]
    await world.cycle()
    replicas = [await a.next_assignment() for a in agents]
    for agent, replica in zip(agents, replicas, strict=True):
        await agent.ready(replica)
    assert all(a.go for a in agents), "the last ready replica launched the gang"
    for agent in agents:
        agent.go.clear()
    assert await world.plane.delivery.resync(older_than_s=0) == 4
    assert [a.go for a in agents] == [[r.allocation_id] for r in replicas]
