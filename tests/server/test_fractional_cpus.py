"""CPU slots to a milli-CPU through the server: half-CPU jobs share a one-CPU node."""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.states import JobState

pytestmark = pytest.mark.anyio


async def test_half_cpu_jobs_share_one_cpu_and_a_third_waits_saying_why(world: World) -> None:
    agent = await world.agent("box", gpus=0, cpus=1)
    jobs = await world.submit_many([{"resources": {"gpus": 0, "cpus": "500m"}}] * 3)
    await world.cycle()
    given = [await agent.next_assignment(), await agent.next_assignment()]
    assert [a.cpus for a in given] == [0.5, 0.5]
    states = [(await world.job(r.job.id)).state for r in jobs]
    assert states.count(JobState.PLACED) == 2
    (entry,), _ = await world.plane.queue.queue(ADMIN, 10)
    assert entry.unplaced is not None
    assert "not enough free CPUs for 0.5 CPUs" in entry.unplaced.summary()
    held = (await world.plane.schedule.snapshot()).allocations
    assert sorted(a.cpus for a in held) == [0.5, 0.5]  # as the store keeps them


async def test_an_agent_offers_fractional_slots(world: World) -> None:
    agent = await world.agent("small", gpus=0, cpus=1.5)
    await world.submit_many([{"resources": {"gpus": 0, "cpus": 0.75}}] * 2)
    await world.cycle()
    assert [(await agent.next_assignment()).cpus for _ in range(2)] == [0.75, 0.75]
    node = (await world.plane.schedule.snapshot()).nodes[0]
    assert node.cpus == 1.5
