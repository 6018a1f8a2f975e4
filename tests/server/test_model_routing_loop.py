"""Models in the server's scheduling loop: the registry's sizes reach the scheduler, jobs go
where their model is (or wait for it when that is quicker), idle agents get prefetch hints,
and gRPC assignments carry the registry entry.

A control plane on a virtual clock with stub agents (``server_harness``), on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from server_harness import ADMIN, World

from corral.core.errors import LinkError
from corral.core.model import JobKind
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.scheduler.api import ReasonCode
from corral.server.agentlink.base import Assignment, JobWork
from corral.server.agentlink.grpc_convert import assign_message
from corral.server.agentlink.grpc_link import GrpcLink
from corral.server.agentlink.model_wire import ModelRef, ModelReport, attach_refs
from corral.server.services.models import Registration
from corral.server.settings import AgentLinkSettings

pytestmark = pytest.mark.anyio
GB = 10**9
SHA = hashlib.sha256(b"sdxl").hexdigest()


@pytest.fixture
async def world(db_url: str, tmp_path: Path) -> AsyncIterator[World]:
    w = await World.open(db_url, tmp_path)
    w.plane.rt.settings.models.prefetch_interval_s = 0.0
    try:
        yield w
    finally:
        await w.close()


async def register(w: World, name: str, size: int) -> None:
    reg = Registration(("https://models.example/" + name,), size, SHA, "checkpoint", "")
    await w.plane.models.put(ADMIN, name, reg)


async def report(w: World, node: str, **fields: Any) -> None:
    await w.plane.model_status.report(node, ModelReport(**fields))


async def test_a_job_goes_to_the_node_whose_agent_has_its_model(world: World) -> None:
    await register(world, "sdxl", 7 * GB)
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        await world.agent(name)
    await report(world, "gpu-b", on_disk=frozenset({"sdxl"}), budget_bytes=100 * GB)
    rec = await world.submit(model="sdxl", resources={"gpus": 1})
    applied = await world.cycle()
    assert [(a.node, a.jobs[0].job_id) for a in applied.placed] == [("gpu-b", rec.job.id)]


async def test_a_job_waits_for_the_busy_holder_when_that_is_quicker(world: World) -> None:
    await register(world, "sdxl", 7 * GB)  # 140 s to fetch at the default 50 MB/s
    holder, idle = await world.agent("holder"), await world.agent("idle")
    await report(world, "holder", loaded=frozenset({"sdxl"}), on_disk=frozenset({"sdxl"}))
    first = await world.submit(model="sdxl", resources={"gpus": 1}, estimated_runtime_s=20)
    (a,) = (await world.cycle()).placed
    assert a.node == "holder"
    await holder.start(a)  # it runs; it should end in 20 s
    second = await world.submit(model="sdxl", resources={"gpus": 1}, estimated_runtime_s=20)
    assert (await world.cycle()).placed == []
    reasons = world.plane.schedule.unplaced[second.job.id].reasons
    assert [r.code for r in reasons] == [ReasonCode.MODEL_WAIT]
    assert "waiting for holder, which has model sdxl" in reasons[0].message
    await holder.finish(a)
    (b,) = (await world.cycle()).placed
    assert (b.node, b.jobs[0].job_id) == ("holder", second.job.id)
    assert first.job.id != second.job.id
    assert idle.node == "idle"


async def test_idle_agents_get_prefetch_hints_for_popular_models(world: World) -> None:
    await register(world, "sdxl", 7 * GB)
    link = HintLink()
    world.plane.prefetch.transport = lambda: link  # type: ignore[assignment,return-value]
    for name in ("busy-a", "idle-b", "idle-c"):
        await world.agent(name)
        await report(world, name, budget_bytes=100 * GB)
    await world.agent("no-cache")  # reported no cache budget: never hinted
    jobs = [{"model": "sdxl", "resources": {"gpus": 1}, "node_selector": {}} for _ in range(9)]
    await world.submit_many(jobs)
    await world.cycle()  # places what fits (one per node), the rest stays queued
    assert len(world.plane.schedule.unplaced) == 5
    assert link.sent == []  # every node is busy now: none idle to prefetch on
    # two nodes finish; five jobs still wait: one copy per four queued jobs is wanted
    await world.plane.prefetch.after_cycle(*await _left(world, drop_nodes={"idle-b", "idle-c"}))
    assert sorted(link.sent) == [("idle-b", "sdxl"), ("idle-c", "sdxl")]
    await world.plane.prefetch.after_cycle(*await _left(world, drop_nodes={"idle-b", "idle-c"}))
    assert len(link.sent) == 2  # not sent again while the agents fetch


async def test_grpc_assignments_carry_the_registry_entry(world: World) -> None:
    await register(world, "sdxl", 7 * GB)
    work = (JobWork("job-1", JobKind.SAMPLE, model="sdxl"), JobWork("job-2", JobKind.SAMPLE))
    msg = assign_message(Assignment("al-1", 1, "n1", work))
    attach_refs(msg, world.plane.models.catalog.ref)
    ref = msg.assign.jobs[0].model_ref
    assert (ref.name, ref.size, ref.sha256) == ("sdxl", 7 * GB, SHA)
    assert list(ref.sources) == ["https://models.example/sdxl"]
    assert not msg.assign.jobs[1].HasField("model_ref")
    link = GrpcLink(AgentLinkSettings(port=0))
    link.model_refs, link.api_port = world.plane.models.catalog.ref, 8470
    hello = pb.ServerMessage(welcome=pb.Welcome(node="n1"))
    welcome, assign = link.outgoing([hello, assign_message(Assignment("al", 1, "n1", work))])
    assert welcome.welcome.api_port == 8470
    assert assign.assign.jobs[0].model_ref.name == "sdxl"


class HintLink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def prefetch(self, node: str, refs: list[ModelRef]) -> None:
        if node == "nobody":
            raise LinkError("not connected")
        self.sent += [(node, r.name) for r in refs]


async def _left(world: World, drop_nodes: set[str]) -> tuple[Any, Any]:
    """The last snapshot as if ``drop_nodes`` had finished their work (idle again)."""
    from dataclasses import replace

    from corral.scheduler.api import Plan

    snapshot = await world.plane.schedule.snapshot()
    allocations = tuple(a for a in snapshot.allocations if a.node not in drop_nodes)
    return replace(snapshot, allocations=allocations), Plan()
