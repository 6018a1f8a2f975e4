"""``GET /v1/history`` in process, on SQLite and PostgreSQL: each class's wait, each
team's quota, and each card's temperature as its agent reports it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from http_harness import Served, eventually, serve

from corral.core import GIB
from corral.core.model import Gpu
from corral.server.agentlink.base import Inventory
from corral.server.agentlink.inprocess import StubAgent

pytestmark = pytest.mark.anyio


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    # node_timeout_s / 4: how often a node's heartbeat is written (0.5 s, not 5)
    faster = {"scheduling": {"node_timeout_s": 2.0}}
    async with serve(db_url, tmp_path, sections=faster, history_sample_s=0.05) as s:
        yield s


async def test_samples_carry_waits_quotas_and_card_temperatures(served: Served) -> None:
    put = await served.admin.put("/v1/teams/vision", json={"quota_gpus": 2})
    assert put.status_code == 200, put.text
    cards = (Gpu(0, "RTX 4090", 24 * GIB, temperature_c=71.0), Gpu(1, "RTX 4090", 24 * GIB))
    agent = StubAgent(served.plane.agents, served.link, Inventory("hot", cards, cpus=2))
    await agent.connect()
    for priority in ("paid", "free"):  # no node has 8 GPUs: both wait
        r = await served.admin.post(
            "/v1/jobs", json={"priority": priority, "team": "vision", "resources": {"gpus": 8}}
        )
        assert r.status_code == 201, r.text

    async def sampled() -> dict[str, Any] | None:
        reply = await served.admin.get("/v1/history", params={"node": "hot", "seconds": 60})
        last = reply.json()["samples"][-1:]
        return last[0] if last and set(last[0]["waited"]) == {"paid", "free"} else None

    last = await eventually(sampled)
    assert last["queued"] == {"paid": 1, "free": 1}
    assert all(w >= 0 for w in last["waited"].values())
    assert last["quota"] == {"vision": 2}
    assert [c["temperature_c"] for c in last["cards"]] == [71.0, None]
    node = (await served.admin.get("/v1/nodes/hot")).json()
    assert [g["temperature_c"] for g in node["gpus"]] == [71.0, None]


async def test_a_heartbeat_s_gpu_figures_replace_the_hello_s(served: Served) -> None:
    hello = (Gpu(0, "RTX 4090", 24 * GIB, 24 * GIB, 0.0, 40.0, numa=1),)
    agent = StubAgent(served.plane.agents, served.link, Inventory("warm", hello, cpus=2))
    await agent.connect()
    beat = (Gpu(0, "RTX 4090", 24 * GIB, 4 * GIB, 0.97, 83.0),)

    async def beaten() -> dict[str, Any] | None:  # beats within the write interval are not kept
        await served.plane.agents.heartbeat("warm", beat)
        (gpu,) = (await served.admin.get("/v1/nodes/warm")).json()["gpus"]
        return gpu if gpu["temperature_c"] == 83.0 else None

    gpu = await eventually(beaten)
    want = {"vram_free_bytes": 4 * GIB, "utilization": 0.97, "temperature_c": 83.0, "numa": 1}
    assert {k: gpu[k] for k in want} == want  # the hello's topology stays

    async def card() -> dict[str, Any] | None:
        reply = await served.admin.get("/v1/history", params={"node": "warm", "seconds": 60})
        cards = [s["cards"][0] for s in reply.json()["samples"] if s["cards"]]
        return cards[-1] if cards and cards[-1]["temperature_c"] == 83.0 else None

    assert (await eventually(card))["vram_used"] == 20 * GIB
