"""The scheduling loop wakes when time alone changes the plan (issue 48, item 1): a reclaim
that waits for the victims' minimum run time happens when it passes, not at the next idle
cycle, and the simulator wakes at the same instant (``Scheduler.wake_at``). Stub agents,
virtual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from server_harness import ADMIN, World

from corral.core.model import Team
from corral.core.states import JobState, StopReason
from corral.server.agentlink.base import StopOrder

pytestmark = pytest.mark.anyio

MIN_RUN = 30.0


@pytest.fixture
async def world(db_url: str, tmp_path: Path) -> AsyncIterator[World]:
    w = await World.open(db_url, tmp_path, min_runtime_before_preemption_s=MIN_RUN)
    try:
        yield w
    finally:
        await w.close()


async def test_a_reclaim_happens_when_the_victims_minimum_run_time_passes(world: World) -> None:
    await world.plane.nodes.put_team(ADMIN, Team("a", quota_gpus=0))
    await world.plane.nodes.put_team(ADMIN, Team("b", quota_gpus=2))
    agent = await world.agent("n1", gpus=2)
    borrowed = await world.submit(team="a", resources={"gpus": 2})
    await world.cycle()
    first = await agent.next_assignment()
    await agent.start(first)
    started = world.clock.now()
    world.clock.advance(5)
    own = await world.submit(team="b", resources={"gpus": 2})
    await world.cycle()
    assert agent.inbox.empty()  # a's work is too young to preempt
    assert world.plane.schedule.wake_at == pytest.approx(started + MIN_RUN)
    world.clock.advance(started + MIN_RUN - world.clock.now() - 0.01)
    await world.cycle()
    assert agent.inbox.empty()  # not a moment early
    world.clock.advance(0.01)
    await world.cycle()
    stop = await agent.receive(5.0)
    assert isinstance(stop, StopOrder)
    assert (stop.allocation_id, stop.reason) == (first.allocation_id, StopReason.PREEMPT)
    assert (await world.job(borrowed.job.id)).state is JobState.RUNNING  # stopping, not gone
    assert (await world.job(own.job.id)).state is JobState.QUEUED  # until a's work has stopped
