"""The autoscaler never overspends: on a real store (SQLite and PostgreSQL) and a virtual
clock, a provider whose list lags, a server that stops mid-launch and restarts on the same
database, two replicas, and machines that never join."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
from server_harness import World

from corral.autoscaler import Join, Pool, SimulatedProvider
from corral.core.events import EventKind
from corral.core.resources import GIB
from corral.server.loops.autoscale import AutoscaleLoop

pytestmark = pytest.mark.anyio

POOL = Pool("g4090", gpus=1, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=8, max_nodes=3,
            cost_per_hour=0.5)  # fmt: skip
LAGGING = 10**9  # the provider's list never shows the machine within the test


def scaler(world: World, provider: object, pools: tuple[Pool, ...] = (POOL,)) -> AutoscaleLoop:
    settings = world.plane.rt.settings.autoscale
    settings.scale_up_delay_s, settings.boot_timeout_s, settings.backoff_s = 30, 900, 300
    plane = world.plane
    return AutoscaleLoop(
        plane.rt, plane.schedule, provider, pools, plane.auth, plane.nodes,  # type: ignore[arg-type]
        lambda: "grpc://control:8471",
    )  # fmt: skip


async def one_waiting_job(world: World, loop: AutoscaleLoop) -> None:
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    await loop.tick()  # starts the job's waiting clock
    world.clock.advance(31)


async def test_a_lagging_list_launches_one_machine_for_one_job(world: World) -> None:
    provider = SimulatedProvider(world.clock.now, lag_s=LAGGING)
    loop = scaler(world, provider)
    await one_waiting_job(world, loop)
    for _ in range(12):  # 12 decisions 3 s apart, the machine never listed
        await loop.tick()
        world.clock.advance(3)
    assert len(provider.launched) == 1
    status = loop.last
    assert status is not None
    assert dict(status.states) == {provider.launched[0][0]: "launching"}


async def test_a_machine_listed_but_never_joined_is_terminated_and_said_so(world: World) -> None:
    provider = SimulatedProvider(world.clock.now)
    loop = scaler(world, provider)
    await one_waiting_job(world, loop)
    await loop.tick()
    [(name, _, _)] = provider.launched
    world.clock.advance(901)
    reply = await loop.tick()
    assert reply is not None
    assert [(r.name, r.code) for r in reply.remove] == [(name, "not_joined")]
    assert provider.running == {}
    removed = [e for e in await world.events() if e.kind is EventKind.NODE_REMOVED]
    assert [e.node for e in removed] == [name]
    assert "did not join" in removed[0].data["reason"]
    metric = world.plane.rt.metrics.autoscaler_not_joined.labels("g4090")._value.get()
    assert metric == 1
    assert loop.backoff == {"g4090": world.clock.now() + 300}


class StopsMidLaunch(SimulatedProvider):
    """The server is killed while the provider handles the launch: the machine starts, the
    answer is never heard."""

    request_ids: ClassVar[list[str]] = []

    async def launch(
        self, pool: Pool, names: Sequence[str], join: Join, *, request_id: str
    ) -> None:
        await super().launch(pool, names, join, request_id=request_id)
        self.request_ids.append(request_id)
        if len(self.request_ids) == 1:
            raise asyncio.CancelledError


async def test_a_restart_mid_launch_sends_it_again_and_starts_nothing_twice(
    db_url: str, tmp_path: Path
) -> None:
    StopsMidLaunch.request_ids = []
    first = await World.open(db_url, tmp_path)
    provider = StopsMidLaunch(first.clock.now, lag_s=LAGGING)
    try:
        loop = scaler(first, provider)
        await one_waiting_job(first, loop)
        with pytest.raises(asyncio.CancelledError):
            await loop.tick()
        stopped_at = first.clock.now()
    finally:
        await first.close()

    again = await World.open(db_url, tmp_path)  # same database, nothing in memory
    try:
        again.clock.advance(stopped_at + 60 - again.clock.now())
        provider.now = again.clock.now
        loop = scaler(again, provider)
        await again.cycle()
        for _ in range(3):
            await loop.tick()
            again.clock.advance(31)
    finally:
        await again.close()
    [first_id, resent_id] = provider.request_ids  # sent again once, with the same request id
    assert resent_id == first_id
    assert len(provider.launched) == 1  # and the provider started the machine once


async def test_only_the_leader_scales_and_a_new_leader_launches_nothing_twice(
    world: World,
) -> None:
    provider = SimulatedProvider(world.clock.now, lag_s=LAGGING)
    leader, follower = scaler(world, provider), scaler(world, provider)
    follower.leading = lambda: False
    await one_waiting_job(world, leader)
    await follower.tick()
    assert provider.launched == []
    await leader.tick()
    assert len(provider.launched) == 1

    leader.leading, follower.leading = (lambda: False), (lambda: True)  # leadership moves
    await follower.tick()  # its clocks start now: the job has not waited here yet
    world.clock.advance(31)
    await follower.tick()
    assert len(provider.launched) == 1  # the launch in flight is in the store, not in memory


async def test_a_failing_provider_is_backed_off_and_the_next_one_delivers(world: World) -> None:
    cloud = SimulatedProvider(world.clock.now, fail_pools=["cheap"])
    local = SimulatedProvider(world.clock.now)
    cheap = Pool("cheap", gpus=1, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=8,
                 cost_per_hour=0.2, provider="cloud")  # fmt: skip
    dear = Pool("dear", gpus=1, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=8,
                cost_per_hour=0.9, provider="local")  # fmt: skip
    plane = world.plane
    loop = AutoscaleLoop(
        plane.rt, plane.schedule, {"cloud": cloud, "local": local}, (cheap, dear), plane.auth,
        plane.nodes, lambda: "grpc://control:8471",
    )  # fmt: skip
    plane.rt.settings.autoscale.scale_up_delay_s = 30
    await one_waiting_job(world, loop)
    await loop.tick()  # the cheapest fails: its provider backs off
    assert cloud.launched == []
    assert local.launched == []
    assert "cheap" in loop.backoff
    said = [e for e in await world.events() if e.kind is EventKind.NODE_REMOVED]
    assert ["launch failed" in e.data["reason"] for e in said] == [True]  # what will not come
    await loop.tick()  # the next cheapest that fits delivers
    assert [pool for _, pool, _ in local.launched] == ["dear"]
    assert loop.last is not None
    assert any(line.startswith("launch 1 x dear: 1 job waited") for line in loop.last.lines)


async def test_spend_is_counted_from_the_ledger(world: World) -> None:
    provider = SimulatedProvider(world.clock.now)
    loop = scaler(world, provider)
    await one_waiting_job(world, loop)
    await loop.tick()
    world.clock.advance(720)  # booting for 12 minutes: it costs from when it was asked for
    await loop.tick()
    assert loop.spend.rate == {"g4090": 0.5}
    assert loop.spend.last_hour["g4090"] == pytest.approx(0.1)


async def test_a_machine_the_provider_stops_listing_no_longer_counts(world: World) -> None:
    provider = SimulatedProvider(world.clock.now)
    loop = scaler(world, provider, (replace(POOL, max_nodes=1),))
    await one_waiting_job(world, loop)
    await loop.tick()
    [(first, _, _)] = provider.launched
    await loop.tick()  # listed: noted in the ledger
    del provider.running[first]  # reclaimed by the cloud before its agent joined
    world.clock.advance(5)
    reply = await loop.tick()
    assert reply is not None
    assert [(x.pool, x.count) for x in reply.launches] == [("g4090", 1)]  # room again
    assert len(provider.launched) == 2


class SlowToForget(SimulatedProvider):
    """A provider whose list shows a terminated machine for a while yet (the first terminate
    of each name is only noted)."""

    def __init__(self, now: Callable[[], float]) -> None:
        super().__init__(now)
        self.asked: list[str] = []

    async def terminate(self, names: Sequence[str]) -> None:
        again = [n for n in names if n in self.asked]
        self.asked += names
        await super().terminate(again)


async def test_a_terminated_machine_the_list_still_shows_is_not_removed_again(
    world: World,
) -> None:
    provider = SlowToForget(world.clock.now)
    loop = scaler(world, provider, (replace(POOL, max_nodes=1),))
    await one_waiting_job(world, loop)
    await loop.tick()
    [(name, _, _)] = provider.launched
    world.clock.advance(901)
    await loop.tick()  # never joined: terminated (the provider keeps listing it)
    world.clock.advance(301)  # the back-off is over
    await world.submit(resources={"gpus": 1})
    await world.cycle()
    await loop.tick()
    world.clock.advance(31)
    reply = await loop.tick()
    assert reply is not None
    assert reply.remove == ()  # not removed (nor counted as not joined) a second time
    assert reply.launches == ()  # and it still holds the pool's one machine
    assert loop.last is not None
    assert dict(loop.last.states) == {name: "terminating"}
    assert world.plane.rt.metrics.autoscaler_not_joined.labels("g4090")._value.get() == 1
    world.clock.advance(901)
    await loop.tick()  # long after: the terminate is sent again, and this time it goes
    assert provider.running == {}
    reply = await loop.tick()
    assert reply is not None
    assert [(x.pool, x.count) for x in reply.launches] == [("g4090", 1)]
