"""Fair mixing through the server: one GPU, one job at a time, two users.

Alice floods first, Bob submits one job after her: with the scheduling loop's
service ledger, Bob's job is the second to run, not the last.
"""

from __future__ import annotations

import pytest
from server_harness import World

from corral.server.agentlink.base import Ack

pytestmark = pytest.mark.anyio


async def test_one_job_at_a_time_mixes_users_across_cycles(world: World) -> None:
    one_gpu = {"gpus": 1}
    for i in range(4):
        await world.submit(resources=one_gpu, user="alice", payload={"i": i})
    world.clock.advance(1.0)
    bob = await world.submit(resources=one_gpu, user="bob")
    agent = await world.agent("home-4090", gpus=1)
    users = []
    for _ in range(3):
        applied = await world.cycle()
        [assignment] = applied.placed
        job = await world.job(assignment.jobs[0].job_id)
        users.append(job.job.user)
        a = await agent.next_assignment()
        assert await agent.start(a) is Ack.ACCEPTED
        assert await agent.finish(a, {job.job.id: {"out.txt": b"ok"}}) is Ack.ACCEPTED
        world.clock.advance(5.0)
    assert users[:2] == ["alice", "bob"], users
    assert (await world.job(bob.job.id)).state.value == "succeeded"
