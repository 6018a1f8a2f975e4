"""A batch cut short by one job's failure (services/results.py ``cut_batch``).

Jobs that finished before the failure keep their results and succeed; the job that failed
is retried or fails as its error says; jobs that never ran go back to the queue without a
failure counted. A failure that names no job fails every unfinished job, as before; a stop
mid-batch leaves the finished jobs succeeded and the others stopped.

Cancelling one job of a running batch drops just that job (a job-level stop, resent by the
resync); cancelling the last one still running stops the allocation.
"""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.states import JobState, StopReason
from corral.server.agentlink.base import Ack, Assignment, StopOrder
from corral.server.agentlink.inprocess import StubAgent

pytestmark = pytest.mark.anyio


async def _batch(
    world: World, n: int = 4, **spec: object
) -> tuple[list[str], StubAgent, Assignment]:
    one = {"kind": "sample", "resources": {"gpus": 1}, "batch_key": "sd15", **spec}
    jobs = await world.submit_many([one] * n)
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    order = [w.job_id for w in a.jobs]  # the order the agent runs them in
    assert sorted(order) == sorted(j.job.id for j in jobs)
    await agent.start(a)
    return order, agent, a


@pytest.mark.parametrize("retryable", [True, False], ids=["retryable", "final"])
async def test_finished_jobs_keep_their_results_and_unrun_ones_are_requeued_uncounted(
    world: World, retryable: bool
) -> None:
    ids, agent, a = await _batch(world)
    first, second, bad, never = ids
    done = {first: {"1.png": b"one"}, second: {"2.png": b"two"}}
    ack = await agent.fail(a, "CUDA out of memory", retryable=retryable, job_id=bad, finished=done)
    assert ack is Ack.ACCEPTED

    for job_id, name, data in ((first, "1.png", b"one"), (second, "2.png", b"two")):
        rec = await world.job(job_id)
        assert rec.state is JobState.SUCCEEDED
        _, got = await world.plane.jobs.result_file(ADMIN, job_id, name)
        assert got == data
    failed = await world.job(bad)
    assert failed.failures == 1
    assert failed.state is (JobState.QUEUED if retryable else JobState.FAILED)
    assert "CUDA out of memory" in failed.attempt_errors[-1].error
    untouched = await world.job(never)
    assert untouched.state is JobState.QUEUED
    assert untouched.failures == 0, "it never ran: no failure counted"
    assert untouched.job.not_before <= world.clock.now(), "and no retry delay"
    assert (await world.kinds(never))[-1] == "job.requeued"


async def test_a_failure_naming_no_job_fails_every_unfinished_job_as_before(world: World) -> None:
    ids, agent, a = await _batch(world, 3)
    await agent.fail(a, "the backend crashed", retryable=False, finished={ids[0]: {"a": b"a"}})
    states = [(await world.job(j)).state for j in ids]
    assert states == [JobState.SUCCEEDED, JobState.FAILED, JobState.FAILED]


async def test_a_stop_mid_batch_keeps_what_finished(world: World) -> None:
    ids, agent, a = await _batch(world, 3, timeout_s=10)
    world.clock.advance(11)
    assert (await world.plane.liveness.tick()).timed_out == [a.allocation_id]
    await agent.fail(a, "stopped", retryable=False, finished={ids[0]: {"a": b"a"}})
    done, *cut = [await world.job(j) for j in ids]
    assert done.state is JobState.SUCCEEDED
    assert [(j.state, j.error) for j in cut] == [(JobState.FAILED, "timed out")] * 2


async def test_only_the_allocations_own_jobs_can_be_reported_finished(world: World) -> None:
    ids, agent, a = await _batch(world, 2)
    other = await world.submit(resources={"gpus": 1})
    await agent.fail(a, "boom", retryable=False, job_id=ids[1], finished={other.job.id: {}})
    assert (await world.job(other.job.id)).state is JobState.QUEUED
    assert [(await world.job(j)).state for j in ids] == [JobState.QUEUED, JobState.FAILED]


async def test_cancelling_one_job_of_a_running_batch_drops_just_that_job(world: World) -> None:
    ids, agent, a = await _batch(world, 3)
    cancelled = await world.plane.jobs.cancel(ADMIN, ids[1])
    assert cancelled.state is JobState.CANCELLED
    order = await agent.receive()
    assert isinstance(order, StopOrder)
    assert (order.allocation_id, order.reason, order.job_id) == (
        a.allocation_id,
        StopReason.CANCEL,
        ids[1],
    )
    alloc = (await world.plane.nodes.get(ADMIN, "n1")).allocations
    assert [x.desired.value for x in alloc] == ["run"], "the batch runs on"
    await agent.finish(a, {ids[0]: {"a": b"a"}, ids[2]: {"c": b"c"}})
    states = [(await world.job(j)).state for j in ids]
    assert states == [JobState.SUCCEEDED, JobState.CANCELLED, JobState.SUCCEEDED]


async def _resent_after_a_lost_order(
    world: World, agent: StubAgent, job_id: str, reason: StopReason
) -> None:
    """Stop ``job_id`` of a running batch on its own; its first order is lost on the way
    (as in real life it may be), and the resync sends it again."""
    stop = world.plane.jobs.cancel if reason is StopReason.CANCEL else world.plane.jobs.interrupt
    await stop(ADMIN, job_id)
    await agent.receive()  # the first order: lost
    world.clock.advance(10)
    assert await world.plane.delivery.resync(older_than_s=5) == 1
    order = await agent.receive()
    assert isinstance(order, StopOrder)
    assert (order.reason, order.job_id) == (reason, job_id)


async def test_the_resync_tells_the_agent_again_to_drop_a_cancelled_job(world: World) -> None:
    ids, agent, _ = await _batch(world, 2)
    await _resent_after_a_lost_order(world, agent, ids[0], StopReason.CANCEL)
    assert await world.plane.delivery.resync(older_than_s=60) == 0, "not yet due again"


async def test_the_resync_tells_the_agent_again_to_interrupt_a_job_of_a_batch(
    world: World,
) -> None:
    ids, agent, a = await _batch(world, 2)
    await _resent_after_a_lost_order(world, agent, ids[0], StopReason.INTERRUPT)
    await agent.finish(a, {ids[0]: {"so-far.png": b"half"}, ids[1]: {"b.png": b"b"}})
    assert (await world.job(ids[0])).state is JobState.SUCCEEDED
    assert await world.plane.delivery.resync(older_than_s=5) == 0, "ended: nothing to resend"


async def test_cancelling_every_job_of_a_batch_stops_the_allocation(world: World) -> None:
    ids, agent, _ = await _batch(world, 2)
    await world.plane.jobs.cancel(ADMIN, ids[0])
    await world.plane.jobs.cancel(ADMIN, ids[1])
    first, second = await agent.receive(), await agent.receive()
    assert isinstance(first, StopOrder)
    assert isinstance(second, StopOrder)
    assert (first.job_id, second.job_id) == (ids[0], "")  # the last stops the whole batch


async def test_interrupting_one_job_of_a_running_batch_stops_just_that_job(world: World) -> None:
    ids, agent, a = await _batch(world, 3)
    for job_id in ids[:2]:  # the one running now, and one whose turn has not come
        rec = await world.plane.jobs.interrupt(ADMIN, job_id)
        assert rec.state is JobState.RUNNING  # until the agent answers
        order = await agent.receive()
        assert isinstance(order, StopOrder)
        assert (order.reason, order.job_id) == (StopReason.INTERRUPT, job_id)
    made = {ids[0]: {"so-far.png": b"half"}, ids[2]: {"c.png": b"c"}}
    await agent.finish(a, made, stopped=[ids[1]])
    first, second, third = [await world.job(j) for j in ids]
    assert first.state is JobState.SUCCEEDED
    assert [f.name for f in first.result] == ["so-far.png"]
    assert (await world.events(ids[0]))[-1].data.get("interrupted") is True
    assert (second.state, second.error) == (JobState.CANCELLED, "interrupted")
    assert third.state is JobState.SUCCEEDED
