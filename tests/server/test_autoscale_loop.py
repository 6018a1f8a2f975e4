"""The autoscaler's loop on a real store (SQLite and PostgreSQL), a virtual clock and the
simulated provider: a machine is launched for waiting work, its agent joins and runs the
work, and it is drained, then removed, once idle."""

from __future__ import annotations

import pytest
from server_harness import World

from corral.autoscaler import Join, Pool, SimulatedProvider
from corral.core.events import EventKind
from corral.core.resources import GIB
from corral.server.loops.autoscale import AutoscaleLoop
from corral.server.services.auth import TokenKind
from corral.server.store import nodes as node_repo

pytestmark = pytest.mark.anyio

POOL = Pool("g4090", gpus=1, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=8, max_nodes=3)


@pytest.fixture
async def scaled(world: World) -> tuple[World, AutoscaleLoop, SimulatedProvider]:
    world.plane.rt.settings.autoscale.scale_up_delay_s = 30
    world.plane.rt.settings.autoscale.idle_s = 600
    world.plane.rt.settings.autoscale.boot_timeout_s = 900
    provider = SimulatedProvider(world.clock.now)
    plane = world.plane
    loop = AutoscaleLoop(
        plane.rt, plane.schedule, provider, (POOL,), plane.auth, plane.nodes,
        lambda: "grpc://control:8471",
    )  # fmt: skip
    return world, loop, provider


async def test_a_machine_comes_for_waiting_work_and_goes_when_idle(
    scaled: tuple[World, AutoscaleLoop, SimulatedProvider],
) -> None:
    world, loop, provider = scaled
    job = await world.submit(resources={"gpus": 1})
    await world.cycle()
    assert job.job.id in world.plane.schedule.unplaced
    assert (await loop.tick()).idle  # type: ignore[union-attr]  # not waited long enough yet

    world.clock.advance(31)
    reply = await loop.tick()
    assert reply is not None
    assert [(x.pool, x.count) for x in reply.launches] == [("g4090", 1)]
    [(name, pool, join)] = provider.launched
    assert pool == "g4090"
    assert name.startswith("g4090-")
    assert join.server == "grpc://control:8471"
    who = await world.plane.auth.authenticate(join.token)  # a real agent token was made
    assert who.kind is TokenKind.AGENT
    assert (await loop.tick()).idle  # type: ignore[union-attr]  # the booting machine will take it

    agent = await world.agent(name, gpus=1)  # the machine's agent joins
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.finish(a)
    assert (await world.job(job.job.id)).job.state.value == "succeeded"

    await loop.tick()  # idle from now
    world.clock.advance(601)
    reply = await loop.tick()
    assert reply is not None
    assert reply.drain == (name,)
    async with world.plane.rt.db.read() as conn:
        rec = await node_repo.get(conn, name)
    assert rec is not None
    assert rec.node.draining
    assert rec.pause_reason == "autoscaler"

    reply = await loop.tick()
    assert reply is not None
    assert [r.name for r in reply.remove] == [name]
    assert provider.running == {}
    async with world.plane.rt.db.read() as conn:
        assert await node_repo.get(conn, name) is None
    kinds = [e.kind for e in await world.events() if e.node == name]
    assert EventKind.NODE_LAUNCHED in kinds
    assert kinds[-2:] == [EventKind.NODE_DRAINING, EventKind.NODE_REMOVED]


async def test_work_coming_back_takes_a_drained_machine_back(
    scaled: tuple[World, AutoscaleLoop, SimulatedProvider],
) -> None:
    world, loop, provider = scaled
    await provider.launch(
        POOL, ["g4090-aaaaaa"], Join("grpc://control:8471", "tok"), request_id="r-1"
    )
    await world.agent("g4090-aaaaaa", gpus=1)
    await loop.tick()
    world.clock.advance(601)
    assert (await loop.tick()).drain == ("g4090-aaaaaa",)  # type: ignore[union-attr]

    await world.submit(resources={"gpus": 1})  # work arrives before the removal
    await world.cycle()  # draining: the scheduler leaves it unplaced
    reply = await loop.tick()
    assert reply is not None
    assert reply.undrain == ("g4090-aaaaaa",)
    assert reply.remove == ()
    assert reply.launches == ()
    async with world.plane.rt.db.read() as conn:
        rec = await node_repo.get(conn, "g4090-aaaaaa")
    assert rec is not None
    assert not rec.node.draining
    assert rec.pause_reason is None
    assert len((await world.cycle()).placed) == 1


async def test_a_machine_that_never_joins_is_removed_and_its_pool_backs_off(
    scaled: tuple[World, AutoscaleLoop, SimulatedProvider],
) -> None:
    world, loop, provider = scaled
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    await loop.tick()
    world.clock.advance(31)
    await loop.tick()
    assert len(provider.running) == 1
    world.clock.advance(901)
    reply = await loop.tick()
    assert reply is not None
    assert len(reply.remove) == 1
    assert "did not join" in reply.remove[0].reason
    assert provider.running == {}
    assert reply.launches == ()  # the pool backs off instead of trying again at once
    assert loop.backoff == {"g4090": world.clock.now() + 300}


async def test_a_failing_provider_is_counted_and_backs_the_pool_off(
    scaled: tuple[World, AutoscaleLoop, SimulatedProvider],
) -> None:
    world, loop, provider = scaled
    provider.fail_pools.add("g4090")
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    await loop.tick()
    world.clock.advance(31)
    await loop.tick()
    assert provider.running == {}
    assert "g4090" in loop.backoff
    errors = world.plane.rt.metrics.autoscaler_errors.labels("launch")._value.get()
    assert errors == 1


async def test_a_wildcard_agent_address_is_refused_not_handed_to_machines(
    scaled: tuple[World, AutoscaleLoop, SimulatedProvider],
) -> None:
    world, loop, provider = scaled
    loop.address = lambda: "grpc://0.0.0.0:8471"  # corral server --host 0.0.0.0
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    await loop.tick()
    world.clock.advance(31)
    await loop.tick()
    assert provider.running == {}  # nothing launched that could never join
    assert "g4090" in loop.backoff
    world.plane.rt.settings.autoscale.agent_server = "grpc://vps.example.com:8471"
    world.clock.advance(301)
    await loop.tick()
    [(_, _, join)] = provider.launched
    assert join.server == "grpc://vps.example.com:8471"
