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
    async with serve(db_url, tmp_path, history_sample_s=0.05) as s:
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
