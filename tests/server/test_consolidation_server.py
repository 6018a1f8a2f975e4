"""A consolidation move through the server: the mover is stopped and requeued, counted as a
move (metric, event), and the waiting job and the moved one both run.

Two 4-GPU nodes each run two 2-GPU jobs; one on each ends, leaving two free cards per node;
a 4-GPU job arrives. Stub agents start what they are given and obey every stop.
"""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World, obey

from corral.core.events import EventKind
from corral.core.model import Team
from corral.server.agentlink.inprocess import StubAgent

pytestmark = pytest.mark.anyio


async def _settle(world: World, agents: list[StubAgent], seconds: float) -> None:
    world.clock.advance(seconds)
    for agent in agents:
        await agent.heartbeat()
    await world.cycle()
    await obey(agents)


async def test_a_move_lets_a_waiting_job_run_and_is_counted_as_a_move(world: World) -> None:
    await world.plane.nodes.put_team(ADMIN, Team("t", 8))
    agents = [await world.agent(f"n{i}", gpus=4, cpus=32) for i in range(2)]
    await world.submit_many([{"resources": {"gpus": 2}, "team": "t"}] * 4)
    await world.cycle()
    await obey(agents)
    for agent in agents:  # one job on each node ends
        assert len(agent.running) == 2
        await agent.finish(next(iter(agent.running.values())))
    world.clock.advance(120)  # past the 60 s minimum run time
    (big,) = await world.submit_many([{"resources": {"gpus": 4}, "team": "t"}])
    applied = await world.cycle()
    assert applied.preempted == []
    assert len(applied.moved) == 1
    (event,) = [e for e in await world.events() if e.kind is EventKind.JOB_PREEMPTED]
    assert event.data["why"].startswith("consolidation: ")
    assert event.data["move_to"] in {"n0", "n1"}
    assert event.data["move_to"] != event.node
    metrics = world.plane.rt.metrics.registry
    assert metrics.get_sample_value("corral_consolidation_moves_total") == 1
    assert metrics.get_sample_value("corral_preemptions_total") == 0
    queue = await world.plane.queue.queue(ADMIN, 10)
    (waiting,) = [e.unplaced for e in queue[0] if e.job.job.id == big.job.id]
    assert waiting is not None
    assert "once 1 allocation there moves to another node (consolidation)" in waiting.summary()
    await obey(agents)  # the mover checkpoints and stops
    for _ in range(3):
        await _settle(world, agents, 1)
    assert (await world.job(big.job.id)).state.value == "running"
    assert event.job_id is not None
    moved = await world.job(event.job_id)
    assert moved.state.value == "running"
    assert moved.node == event.data["move_to"]
    held = (await world.plane.schedule.snapshot()).allocations
    assert sorted(len(a.gpu_indices) for a in held) == [2, 2, 4]  # no claim left behind
