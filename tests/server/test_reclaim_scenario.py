"""Issue 48's reclaim through the server: every eviction needed, true reasons, flags right.

4 nodes x 10 GPUs; team a (quota 20) runs ten 3-GPU jobs, team b (quota 20) submits five
4-GPU jobs 20 s later. Stub agents start what they are given and obey every stop.
"""

from __future__ import annotations

import pytest
from server_harness import ADMIN, START, World, obey

from corral.core.events import EventKind
from corral.core.model import Team

pytestmark = pytest.mark.anyio


async def test_a_reclaim_evicts_only_what_the_owed_team_needs(world: World) -> None:
    await world.plane.nodes.put_team(ADMIN, Team("a", 20))
    await world.plane.nodes.put_team(ADMIN, Team("b", 20))
    agents = [await world.agent(f"n{i}", gpus=10, cpus=64) for i in range(4)]
    await world.submit_many([{"resources": {"gpus": 3}, "team": "a"}] * 10)
    await world.cycle()
    await obey(agents)
    cards = {a: (ag.node, item.gpu_indices) for ag in agents for a, item in ag.running.items()}
    world.clock.advance(20)
    b_jobs = await world.submit_many([{"resources": {"gpus": 4}, "team": "b"}] * 5)
    await world.cycle()
    await obey(agents)
    queue = await world.plane.queue.queue(ADMIN, 10)
    waits = [e.unplaced for e in queue[0] if e.job.job.team == "b"]
    assert len(waits) == 4
    for why in waits:
        assert why is not None
        assert "team a's work passes its 60 s minimum run time in ~40 s" in why.summary()

    preempted: list[str] = []
    while world.clock.now() < START + 120:
        world.clock.advance(10)
        for agent in agents:
            await agent.heartbeat()
        applied = await world.cycle()
        preempted += applied.preempted
        await obey(agents)

    assert len(preempted) == 4  # a 30 -> 18: the fewest 3-GPU evictions that fit four 4-GPU jobs
    held = (await world.plane.schedule.snapshot()).allocations
    b_cards = {(a.node, g) for a in held if a.team == "b" for g in a.gpu_indices}
    for alloc_id in preempted:  # every evicted card went to b: none left idle
        node, gpus = cards[alloc_id]
        assert {(node, g) for g in gpus} <= b_cards
    used = {t: sum(len(a.gpu_indices) for a in held if a.team == t) for t in "ab"}
    assert used == {"a": 18, "b": 20}
    assert not any(a.borrowed for a in held)  # 18 of a's 20, 20 of b's 20: nobody borrows
    for rec in b_jobs:
        assert (await world.job(rec.job.id)).state.value == "running"
    evictions = [e for e in await world.events() if e.kind is EventKind.JOB_PREEMPTED]
    assert len(evictions) == 4
    for e in evictions:
        assert e.data["why"].startswith("reclaim: team b is owed its quota of 20 GPUs; team a")
        # evicted for b, and not placed again on the 2 cards left idle: a holds 18 of its 20
        assert e.job_id is not None
        assert (await world.job(e.job_id)).state.value == "queued"
