"""Scenarios through the control plane with stub agents: placement -> start -> progress -> finish,
and everything that can happen on the way (node loss, retries, cancel, interrupt, timeouts).

Each test runs on SQLite and on PostgreSQL (the ``world`` fixture).
"""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.errors import Conflict
from corral.core.states import JobState, StopReason
from corral.scheduler.api import Placement, Plan, Preemption, ReasonCode
from corral.server.agentlink.base import Ack
from corral.server.services.placement import apply_plan

pytestmark = pytest.mark.anyio


async def test_job_runs_from_placement_to_result(world: World) -> None:
    job = await world.submit(kind="sample", resources={"gpus": 1}, payload={"prompt": "a cat"})
    agent = await world.agent("n1")
    applied = await world.cycle()
    assert [a.jobs[0].job_id for a in applied.placed] == [job.job.id]

    a = await agent.next_assignment()
    assert (a.node, a.attempt, a.gpu_indices) == ("n1", 1, (0,))
    assert dict(a.jobs[0].payload) == {"prompt": "a cat"}
    assert (await world.job(job.job.id)).state is JobState.PLACED

    assert await agent.start(a) is Ack.ACCEPTED
    assert (await world.job(job.job.id)).state is JobState.RUNNING
    assert await agent.progress(a, 0.4, "step 4/10") is Ack.ACCEPTED
    assert await agent.preview(a, job.job.id, b"\x89PNG fake") is Ack.ACCEPTED
    assert await agent.log(a, "loading model", "sampling") is Ack.ACCEPTED
    assert await agent.finish(a, {job.job.id: {"image.png": b"PNGDATA"}}) is Ack.ACCEPTED

    done = await world.job(job.job.id)
    assert done.state is JobState.SUCCEEDED
    assert done.finished_at == world.clock.now()
    assert done.started_at == world.clock.now()
    assert [f.name for f in done.result] == ["image.png"]
    f, data = await world.plane.jobs.result_file(ADMIN, job.job.id, "image.png")
    assert data == b"PNGDATA"
    assert f.size == 7
    kinds = await world.kinds(job.job.id)
    assert kinds == [
        "job.submitted",
        "job.placed",
        "job.started",
        "job.progress",
        "job.preview",
        "job.log",
        "job.succeeded",
    ]
    preview = next(e for e in await world.events(job.job.id) if e.kind.value == "job.preview")
    key = preview.data["url"].rsplit("/", 1)[1]
    assert await world.plane.jobs.preview(ADMIN, job.job.id, key) == b"\x89PNG fake"


async def test_without_agents_jobs_stay_queued_with_reasons(world: World) -> None:
    job = await world.submit(resources={"gpus": 2})
    await world.cycle()
    assert (await world.job(job.job.id)).state is JobState.QUEUED
    unplaced = world.plane.schedule.unplaced[job.job.id]
    assert unplaced.reasons, "an unplaced job must say why"
    entries, total = await world.plane.queue.queue(ADMIN, 10)
    assert total == 1
    assert entries[0].unplaced is unplaced


async def test_paused_node_gets_no_work_until_resumed(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.plane.nodes.pause(ADMIN, "n1")
    assert agent.intake_open is False
    await world.cycle()
    codes = {r.code for r in world.plane.schedule.unplaced[job.job.id].reasons}
    assert ReasonCode.NODE_PAUSED in codes
    await world.plane.nodes.resume(ADMIN, "n1")
    assert agent.intake_open is True
    assert len((await world.cycle()).placed) == 1


async def test_lost_node_requeues_with_next_attempt_and_fences_the_old_one(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    old = await world.agent("n1")
    await world.cycle()
    a1 = await old.next_assignment()
    await old.start(a1)
    await old.checkpoint(a1, "ckpt/step-50")
    old.disconnect()

    report = await world.tick(after=31)
    assert report.lost_nodes == ["n1"]
    requeued = await world.job(job.job.id)
    assert (requeued.state, requeued.job.attempt, requeued.failures) == (JobState.QUEUED, 1, 1)

    new = await world.agent("n2")
    await world.cycle()
    a2 = await new.next_assignment()
    assert a2.attempt == 2
    assert a2.jobs[0].checkpoint == "ckpt/step-50"

    # The old node comes back and reports its stale attempt: fenced out.
    assert await old.finish(a1) is Ack.STALE
    reply = await old.connect(running=[a1])
    assert [(s.allocation_id, s.reason) for s in reply.stop] == [
        (a1.allocation_id, StopReason.CANCEL)
    ]
    assert await new.finish(a2, {job.job.id: {"out": b"v2"}}) is Ack.ACCEPTED
    done = await world.job(job.job.id)
    assert done.state is JobState.SUCCEEDED
    assert [f.key for f in done.result] == [f"results/{job.job.id}/2/out"]
    assert "job.requeued" in await world.kinds(job.job.id)


async def test_a_result_for_a_wrong_attempt_is_refused(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    ack = await world.plane.agents.finished("n1", a.allocation_id, a.attempt + 1, [])
    assert ack is Ack.STALE
    other_node = await world.plane.agents.finished("n2", a.allocation_id, a.attempt, [])
    assert other_node is Ack.UNKNOWN
    assert (await world.job(job.job.id)).state is JobState.RUNNING


async def test_duplicate_finished_is_recorded_once(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    assert await agent.finish(a) is Ack.ACCEPTED
    assert await agent.finish(a) is Ack.DUPLICATE
    done = await world.job(job.job.id)
    assert len(done.result) == 1
    assert (await world.kinds(job.job.id)).count("job.succeeded") == 1


async def test_retryable_failure_backs_off_then_gives_up(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=2)
    agent = await world.agent("n1")
    await world.cycle()
    a1 = await agent.next_assignment()
    await agent.start(a1)
    await agent.fail(a1, "CUDA out of memory", retryable=True)
    waiting = await world.job(job.job.id)
    assert waiting.state is JobState.QUEUED
    assert waiting.job.not_before > world.clock.now()

    assert (await world.cycle()).placed == []  # still backing off
    world.clock.advance(waiting.job.not_before - world.clock.now() + 0.01)
    await world.cycle()
    a2 = await agent.next_assignment()
    assert a2.attempt == 2
    await agent.start(a2)
    await agent.fail(a2, "CUDA out of memory", retryable=True)
    failed = await world.job(job.job.id)
    assert failed.state is JobState.FAILED
    assert failed.error is not None
    assert "gave up after 2 attempts" in failed.error


async def test_non_retryable_failure_fails_at_once(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=5)
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.fail(a, "bad prompt", retryable=False)
    rec = await world.job(job.job.id)
    assert (rec.state, rec.error) == (JobState.FAILED, "bad prompt")


async def test_cancel_running_job_stops_it_and_drops_late_results(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    cancelled = await world.plane.jobs.cancel(ADMIN, job.job.id)
    assert cancelled.state is JobState.CANCELLED
    order = await agent.receive()
    assert order.reason is StopReason.CANCEL  # type: ignore[union-attr]
    assert await agent.finish(a) is Ack.ACCEPTED  # the allocation ends, its result is dropped
    rec = await world.job(job.job.id)
    assert rec.state is JobState.CANCELLED
    assert rec.result == ()
    assert (await world.plane.jobs.cancel(ADMIN, job.job.id)).state is JobState.CANCELLED


async def test_cancel_of_a_finished_job_is_a_conflict(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.finish(a)
    with pytest.raises(Conflict, match="already succeeded"):
        await world.plane.jobs.cancel(ADMIN, job.job.id)


async def test_interrupt_keeps_what_was_produced(world: World) -> None:
    job = await world.submit(kind="sample", resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    still = await world.plane.jobs.interrupt(ADMIN, job.job.id)
    assert still.state is JobState.RUNNING  # until the agent answers
    order = await agent.receive()
    assert order.reason is StopReason.INTERRUPT  # type: ignore[union-attr]
    await agent.finish(a, {job.job.id: {"partial.png": b"half"}})
    rec = await world.job(job.job.id)
    assert rec.state is JobState.SUCCEEDED
    assert [f.name for f in rec.result] == ["partial.png"]
    last = (await world.events(job.job.id))[-1]
    assert last.data.get("interrupted") is True


async def test_interrupt_before_start_cancels(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    rec = await world.plane.jobs.interrupt(ADMIN, job.job.id)
    assert rec.state is JobState.CANCELLED


async def test_timeout_stops_the_job_and_fails_it(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, timeout_s=10)
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    assert (await world.tick(after=5)).timed_out == []
    await agent.heartbeat()
    assert (await world.tick(after=6)).timed_out == [a.allocation_id]
    order = await agent.receive()
    assert order.reason is StopReason.TIMEOUT  # type: ignore[union-attr]
    await agent.stopped(a)
    rec = await world.job(job.job.id)
    assert (rec.state, rec.error) == (JobState.FAILED, "timed out")


async def test_an_unanswered_stop_is_taken_as_done(world: World) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    await world.plane.jobs.cancel(ADMIN, job.job.id)
    grace = world.plane.rt.settings.scheduling.stop_grace_s
    for _ in range(3):  # keep the node alive while the agent ignores the stop
        world.clock.advance((grace + 30) / 3 + 1)
        await world.plane.agents.heartbeat("n1")
    report = await world.tick()
    assert report.forced_stops == [a.allocation_id]
    view = await world.plane.nodes.get(ADMIN, "n1")
    assert view.allocations == ()


async def test_agent_restart_gets_pending_work_again_and_loses_running_work(world: World) -> None:
    first = await world.submit(resources={"gpus": 1})
    second = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1", gpus=2)
    await world.cycle()
    a, b = await agent.next_assignment(), await agent.next_assignment()
    running, pending = (a, b) if a.jobs[0].job_id == first.job.id else (b, a)
    await agent.start(running)
    agent.disconnect()
    reply = await agent.connect(running=[])
    assert [x.allocation_id for x in reply.assign] == [pending.allocation_id]
    assert (await world.job(first.job.id)).state is JobState.QUEUED
    assert (await world.job(second.job.id)).state is JobState.PLACED


async def test_preemption_checkpoints_requeues_and_resumes(world: World) -> None:
    victim = await world.submit(resources={"gpus": 1}, priority="batch")
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.checkpoint(a, "ckpt/7")
    urgent = await world.submit(resources={"gpus": 1}, priority="interactive")
    plan = Plan(
        placements=(
            Placement(
                "p",
                (urgent.job.id,),
                "n1",
                gpu_indices=(0,),
                gpu_milli=1000,
                preempts=(a.allocation_id,),
            ),
        ),
        preemptions=(
            Preemption(a.allocation_id, (victim.job.id,), "n1", urgent.job.id, "priority"),
        ),
    )
    applied = await apply_plan(world.plane.rt, plan, {urgent.job.id: urgent})
    assert applied.placed == []
    assert applied.preempted == [a.allocation_id]
    order = await agent.receive()
    assert order.reason is StopReason.PREEMPT  # type: ignore[union-attr]
    assert order.grace_s == world.plane.rt.settings.scheduling.preemption_grace_s  # type: ignore[union-attr]
    await agent.stopped(a)
    rec = await world.job(victim.job.id)
    assert (rec.state, rec.failures, rec.checkpoint) == (JobState.QUEUED, 0, "ckpt/7")


async def test_gang_is_all_or_nothing(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, replicas=2, kind="train")
    n1, n2 = await world.agent("n1"), await world.agent("n2")
    await world.cycle()
    r1, r2 = await n1.next_assignment(), await n2.next_assignment()
    assert {r1.replica, r2.replica} == {0, 1}
    assert r1.replicas == 2
    await n1.start(r1)
    await n2.start(r2)
    await n1.fail(r1, "NCCL timeout")
    assert (await world.job(job.job.id)).state is JobState.QUEUED
    order = await n2.receive()
    assert order.allocation_id == r2.allocation_id  # the sibling is told to stop
    await n2.stopped(r2)
    world.clock.advance(60)  # past the retry backoff
    await world.cycle()
    s1, s2 = await n1.next_assignment(), await n2.next_assignment()
    assert s1.attempt == s2.attempt == 2
    await n1.start(s1)
    await n2.start(s2)
    await n1.finish(s1)
    assert (await world.job(job.job.id)).state is JobState.RUNNING  # waits for every replica
    await n2.finish(s2)
    done = await world.job(job.job.id)
    assert done.state is JobState.SUCCEEDED
    assert len(done.result) == 2
