"""Retries, failing nodes and resumes through the control plane (stub agents, virtual clock).

* retries back off exponentially and stop at ``max_attempts``;
* a job failing the same way on several nodes fails for good, listing every attempt;
* a node failing job after job is paused, with the reason in its JSON and an event;
* a requeued job's next attempt gets its latest checkpoint and step, and says so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from server_harness import ADMIN, World

from corral.core.states import JobState
from corral.scheduler.api import ReasonCode
from corral.server.agentlink.inprocess import StubAgent
from corral.server.api.render import job_out, node_out

pytestmark = pytest.mark.anyio


@pytest.fixture
async def strict(db_url: str, tmp_path: Path) -> AsyncIterator[World]:
    """A world that pauses a node after 3 failures in a row."""
    w = await World.open(db_url, tmp_path, node_failure_pause=3, retry_backoff_s=2.0)
    try:
        yield w
    finally:
        await w.close()


async def run_and_fail(world: World, agent: StubAgent, error: str, retryable: bool = True) -> None:
    """Place what is due, then fail the assignment ``agent`` gets."""
    world.clock.advance(600)  # past any retry backoff
    await agent.heartbeat()
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.fail(a, error, retryable=retryable)


async def test_retries_back_off_exponentially(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=5)
    agent = await world.agent("n1")
    delays = []
    for _ in range(3):
        await run_and_fail(world, agent, "flaky")
        rec = await world.job(job.job.id)
        delays.append(rec.job.not_before - world.clock.now())
    assert delays == [2.0, 4.0, 8.0]


async def test_the_same_failure_on_three_nodes_fails_the_job_with_every_attempt(
    world: World,
) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=10)
    nodes = ["n1", "n2", "n3"]
    for i, name in enumerate(nodes):
        agent = await world.agent(name)
        await run_and_fail(world, agent, f"CUDA error: illegal address 0x7f3a{i}b2c at step {i}")
        if (await world.job(job.job.id)).state is JobState.QUEUED:
            await world.plane.nodes.pause(ADMIN, name)  # the next attempt goes elsewhere

    rec = await world.job(job.job.id)
    assert rec.state is JobState.FAILED
    assert rec.failures == 3, "failed at the third node, with 7 attempts left"
    assert rec.error is not None
    assert "the same failure on 3 nodes" in rec.error
    assert "attempt 1 on n1: CUDA error" in rec.error
    assert "attempt 3 on n3: CUDA error" in rec.error
    shown = job_out(rec)
    assert [(a.attempt, a.node) for a in shown.attempts] == [(1, "n1"), (2, "n2"), (3, "n3")]


async def test_failing_twice_on_one_node_is_not_several_nodes(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=10)
    n1 = await world.agent("n1")
    await run_and_fail(world, n1, "segfault in kernel 12")
    await run_and_fail(world, n1, "segfault in kernel 13")
    await world.plane.nodes.pause(ADMIN, "n1")
    await run_and_fail(world, await world.agent("n2"), "segfault in kernel 14")
    rec = await world.job(job.job.id)
    assert (rec.state, rec.failures) == (JobState.QUEUED, 3)


async def test_a_retry_runs_on_another_node_when_one_has_room(world: World) -> None:
    """Best fit alone would send the retry back to the node that just failed it (its card
    is free again and it is the fuller node); the retry passes that node over."""
    job = await world.submit(resources={"gpus": 1}, max_attempts=3)
    n1 = await world.agent("n1", gpus=2)
    await world.cycle()
    first = await n1.next_assignment()
    n2 = await world.agent("n2", gpus=2)
    await world.submit(resources={"gpus": 1})  # keeps n1 the fuller node: best fit's pick
    await world.cycle()
    filler = await n1.next_assignment()
    assert filler.jobs[0].job_id != job.job.id
    await n1.start(first)
    await n1.fail(first, "CUDA error: an illegal memory access was encountered")
    world.clock.advance(600)  # past the backoff
    await n1.heartbeat()
    await n2.heartbeat()
    await world.cycle()
    retry = await n2.next_assignment()
    assert retry.jobs[0].job_id == job.job.id
    rec = await world.job(job.job.id)
    assert (rec.state, rec.node, rec.job.avoid_nodes) == (JobState.PLACED, "n2", {"n1"})


async def test_a_retry_goes_back_to_the_node_it_failed_on_when_no_other_has_room(
    world: World,
) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=3)
    n1 = await world.agent("n1")
    await run_and_fail(world, n1, "flaky")
    await run_and_fail(world, n1, "flaky")  # the only node: it runs there again
    rec = await world.job(job.job.id)
    assert (rec.state, rec.failures) == (JobState.QUEUED, 2)
    assert [e.node for e in rec.attempt_errors] == ["n1", "n1"]


async def test_different_failures_use_every_attempt(world: World) -> None:
    job = await world.submit(resources={"gpus": 1}, max_attempts=3)
    for name, error in (("n1", "disk full"), ("n2", "CUDA out of memory"), ("n3", "timeout")):
        await run_and_fail(world, await world.agent(name), error)
        await world.plane.nodes.pause(ADMIN, name)
    rec = await world.job(job.job.id)
    assert rec.state is JobState.FAILED
    assert rec.error is not None
    assert rec.error.startswith("timeout (gave up after 3 attempts). Attempts: attempt 1 on n1")


async def test_a_node_failing_three_jobs_in_a_row_is_paused_with_the_reason(
    strict: World,
) -> None:
    jobs = [await strict.submit(resources={"gpus": 1}, max_attempts=1) for _ in range(4)]
    agent = await strict.agent("n1")
    for _ in range(3):
        await run_and_fail(strict, agent, "CUDA error: unknown error")

    view = await strict.plane.nodes.get(ADMIN, "n1")
    shown = node_out(view)
    assert shown.paused is True
    assert shown.failure_streak == 3
    assert shown.pause_reason is not None
    assert "3 jobs in a row failed" in shown.pause_reason
    assert "CUDA error: unknown error" in shown.pause_reason
    assert agent.intake_open is False
    paused = [e for e in await strict.events() if e.kind.value == "node.paused"]
    assert [(e.node, e.data["auto"]) for e in paused] == [("n1", True)]

    await strict.cycle()
    waiting = [j for j in jobs if (await strict.job(j.job.id)).state is JobState.QUEUED]
    assert len(waiting) == 1
    last = strict.plane.schedule.unplaced[waiting[0].job.id]
    assert ReasonCode.NODE_PAUSED in {r.code for r in last.reasons}

    resumed = node_out(await strict.plane.nodes.resume(ADMIN, "n1"))
    assert (resumed.paused, resumed.pause_reason, resumed.failure_streak) == (False, None, 0)


async def test_a_success_resets_the_count_and_bad_input_does_not_count(strict: World) -> None:
    for _ in range(6):
        await strict.submit(resources={"gpus": 1}, max_attempts=1)
    agent = await strict.agent("n1")
    await run_and_fail(strict, agent, "flaky driver")
    await run_and_fail(strict, agent, "flaky driver")
    strict.clock.advance(1)
    await strict.cycle()
    ok = await agent.next_assignment()
    await agent.finish(ok)
    await run_and_fail(strict, agent, "flaky driver")
    await run_and_fail(strict, agent, "prompt too long", retryable=False)
    await run_and_fail(strict, agent, "prompt too long", retryable=False)
    view = await strict.plane.nodes.get(ADMIN, "n1")
    assert (view.record.node.paused, view.record.failure_streak) == (False, 1)


async def test_the_next_attempt_resumes_from_the_latest_checkpoint_and_says_so(
    world: World,
) -> None:
    job = await world.submit(resources={"gpus": 1}, kind="train")
    n1 = await world.agent("n1")
    await world.cycle()
    a1 = await n1.next_assignment()
    assert (a1.jobs[0].checkpoint, a1.jobs[0].checkpoint_step) == (None, 0)
    assert job_out(await world.job(job.job.id)).resumed_from_step is None
    await n1.start(a1)
    await n1.checkpoint(a1, "blob:uploads/x/1/aa", step=20)
    await n1.checkpoint(a1, "blob:uploads/x/1/bb", step=30)
    n1.disconnect()
    await world.tick(after=31)

    n2 = await world.agent("n2")
    await world.cycle()
    a2 = await n2.next_assignment()
    assert (a2.jobs[0].checkpoint, a2.jobs[0].checkpoint_step) == ("blob:uploads/x/1/bb", 30)
    shown = job_out(await world.job(job.job.id))
    assert (shown.checkpoint_step, shown.resumed_from_step, shown.attempt) == (30, 30, 2)
    placed = [e for e in await world.events(job.job.id) if e.kind.value == "job.placed"]
    assert [e.data.get("resumed_from_step") for e in placed] == [None, 30]
    assert [e.data.get("message") for e in placed] == [None, "resumed from step 30 on node n2"]
    assert [a.error for a in shown.attempts] == ["node n1 was lost"]


async def test_a_checkpoint_report_reaches_the_schedulers_choice_of_victims(world: World) -> None:
    """Preemption prefers victims that lose least: it must see when each last checkpointed."""
    await world.submit(resources={"gpus": 1}, priority="batch")
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    world.clock.advance(50)
    await agent.checkpoint(a, "/shared/ck/1", step=5)
    snapshot = await world.plane.schedule.snapshot()
    assert [x.last_checkpoint_at for x in snapshot.allocations] == [world.clock.now()]
