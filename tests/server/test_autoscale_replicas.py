"""Two replicas on one PostgreSQL, both with the autoscaler on and one command provider whose
list never shows what it launched: only the leader scales, and when the leader goes, the
replica that takes over launches nothing again (what is in flight is in the store)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from server_harness import ADMIN, settings_for

from corral.server.api.schemas import JobIn
from corral.server.app import create_plane
from corral.server.plane import ControlPlane
from corral.server.services.jobs import Draft, new_job_id

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("provider_script.py")
FAST = {"idle_cycle_s": 30.0, "leader_retry_s": 0.2, "resync_s": 30.0}


@pytest.fixture
async def replica(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[[], Any]]:
    monkeypatch.setenv("PROVIDER_LAG_S", "100000")  # the list never shows a launch here
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: g4090, gpus: 1, vram: 24GiB, cpus: 2, max_nodes: 3}\n")
    opened: list[ControlPlane] = []

    async def open_replica() -> ControlPlane:
        settings = settings_for(pg_url, tmp_path, **FAST)
        scaling = settings.autoscale
        scaling.pools_file = pools
        scaling.command = f"{sys.executable} {SCRIPT} {tmp_path / 'provider.json'}"
        scaling.agent_server = "grpc://vps.example.com:8471"
        scaling.tick_s, scaling.scale_up_delay_s = 0.1, 0
        plane = create_plane(settings, run_loops=True)
        await plane.start()
        opened.append(plane)
        return plane

    try:
        yield open_replica
    finally:
        for plane in reversed(opened):
            await plane.stop()


async def test_only_the_leader_launches_and_its_successor_launches_nothing_again(
    replica: Callable[[], Any], tmp_path: Path
) -> None:
    first: ControlPlane = await replica()
    await eventually(lambda: first.schedule.leading, "the first replica leads")
    second: ControlPlane = await replica()
    await submit(second)
    state = tmp_path / "provider.json"
    await eventually(state.exists, "a launch")
    assert first.autoscale is not None
    assert second.autoscale is not None
    ticks = first.autoscale.ticks
    await eventually(lambda: first.autoscale.ticks >= ticks + 5, "five more decisions")
    assert second.autoscale.ticks == 0  # the follower decides nothing
    assert launches(state) == 1

    await first.stop()  # the leader goes; the other takes over
    await eventually(lambda: second.autoscale.ticks >= 5, "five decisions by the new leader")
    assert launches(state) == 1


def launches(state: Path) -> int:
    return int(json.loads(state.read_text())["launches"])


async def submit(plane: ControlPlane) -> None:
    body = JobIn.model_validate({"resources": {"gpus": 1}})
    job = body.to_job(new_job_id(), team="default", idempotency_key=None)
    await plane.jobs.submit(ADMIN, [Draft(job, body.request_hash("default"))])


async def eventually(probe: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)
