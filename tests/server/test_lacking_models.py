"""A node whose backend lacks a job's model, through the control plane (stub agents, virtual
clock): the job moves to another node at once, is never sent back there, and fails naming
the model only when every node offering its backend said it lacks it; the node is not
blamed for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from server_harness import ADMIN, World

from corral.core.model_names import lacking
from corral.core.states import JobState
from corral.scheduler.api import ReasonCode
from corral.server.agentlink.inprocess import StubAgent
from corral.server.store import nodes as node_repo

pytestmark = pytest.mark.anyio

NO_LORA = lacking("comfyui", ["lora:ink.safetensors"], "lora_name: 'ink.safetensors' not in []")


@pytest.fixture
async def strict(db_url: str, tmp_path: Path) -> AsyncIterator[World]:
    """A world that pauses a node after 2 failures in a row and backs retries off 60 s."""
    w = await World.open(db_url, tmp_path, node_failure_pause=2, retry_backoff_s=60.0)
    try:
        yield w
    finally:
        await w.close()


async def comfy(world: World, name: str) -> StubAgent:
    return await world.agent(name, backends=frozenset({"comfyui"}))


async def fail_lacking(world: World, agent: StubAgent) -> str:
    """Place what is due; ``agent`` gets it and says its backend lacks the LoRA."""
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.fail(a, NO_LORA, retryable=True)
    return a.jobs[0].job_id


async def submit(world: World) -> str:
    rec = await world.submit(
        backend="comfyui", models=["lora:ink.safetensors"], resources={"gpus": 1}, max_attempts=1
    )
    return rec.job.id


async def test_the_job_moves_at_once_and_never_back_to_the_node_that_lacks_its_model(
    strict: World,
) -> None:
    job_id = await submit(strict)
    n1, n2 = await comfy(strict, "n1"), await comfy(strict, "n2")
    await strict.plane.nodes.pause(ADMIN, "n2")
    await fail_lacking(strict, n1)
    rec = await strict.job(job_id)
    assert (rec.state, rec.job.lacking_nodes) == (JobState.QUEUED, {"n1"})
    assert rec.job.not_before <= strict.clock.now(), "no backoff: nothing changes on n1"
    await n1.heartbeat()
    await strict.cycle()
    assert n1.inbox.empty(), "never sent back to n1, though n1 is free and alone"
    reasons = strict.plane.schedule.unplaced[job_id].reasons
    assert ReasonCode.MODEL_MISSING in {r.code for r in reasons}
    await strict.plane.nodes.resume(ADMIN, "n2")
    await strict.cycle()
    again = await n2.next_assignment()
    assert again.jobs[0].job_id == job_id
    await n2.start(again)
    await n2.finish(again)
    assert (await strict.job(job_id)).state is JobState.SUCCEEDED


async def test_it_fails_naming_the_model_once_every_node_said_so(strict: World) -> None:
    job_id = await submit(strict)
    n1, n2 = await comfy(strict, "n1"), await comfy(strict, "n2")
    await strict.agent("py", backends=frozenset({"python"}))  # offers another backend
    await fail_lacking(strict, n1)
    await fail_lacking(strict, n2)
    rec = await strict.job(job_id)
    assert rec.state is JobState.FAILED
    assert rec.error is not None
    assert rec.error.startswith(
        "no node has model lora:ink.safetensors: every node with the comfyui backend said it "
        "lacks it (n1, n2)"
    ), rec.error


async def test_a_node_that_is_away_may_still_have_it(strict: World) -> None:
    job_id = await submit(strict)
    away = await comfy(strict, "away")
    away.disconnect()
    await strict.tick(after=31)  # lost
    await fail_lacking(strict, await comfy(strict, "n1"))
    assert (await strict.job(job_id)).state is JobState.QUEUED


async def test_lacking_a_model_is_not_held_against_the_node(strict: World) -> None:
    n1 = await comfy(strict, "n1")
    for _ in range(3):  # more than node_failure_pause
        await submit(strict)
        await fail_lacking(strict, n1)
    async with strict.plane.rt.db.read() as conn:
        node = await node_repo.get(conn, "n1")
    assert node is not None
    assert (node.node.paused, node.failure_streak) == (False, 0)
