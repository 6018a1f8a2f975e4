"""Attack: grow the server's memory through the drop-in APIs (issue 45, item 3).

180 ``POST /sdapi/v1/options`` of 3.5 MB each took the server from 125 to
847 MB for good: every caller's options were kept forever. Now the body is
capped, options must be the backends' own, one caller's kept options are
capped, and callers are kept for the most recently used few only (and
forgotten when idle), which shows as an old caller's options being gone.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from http_harness import ADMIN_TOKEN, Served, serve

from corral.server.services.compat_a1111 import CallerStates

pytestmark = pytest.mark.anyio

CAP = 4096  # compat.options_max_bytes
CALLERS = 3  # compat.max_callers
OPTIONS = {"sd_model_checkpoint": "tiny.safetensors", "samples_format": "png", "eta_noise": 0}
CATALOG = {
    "options": OPTIONS,
    "sd-models": [{"title": "tiny.safetensors", "model_name": "tiny", "filename": "tiny"}],
}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    compat = {"options_max_bytes": CAP, "max_callers": CALLERS, "catalog_ttl_s": 3600}
    async with serve(str(tmp_path / "c.db"), tmp_path, sections={"compat": compat}) as s:
        yield s


def webui(s: Served, user: str) -> httpx.AsyncClient:
    """A client as a tool talking to a webui started with ``--api-auth`` would make it."""
    basic = base64.b64encode(f"{user}:{ADMIN_TOKEN}".encode()).decode()
    return httpx.AsyncClient(
        base_url=s.base_url, headers={"Authorization": f"Basic {basic}"}, timeout=10
    )


async def with_catalog(s: Served, client: httpx.AsyncClient) -> None:
    """Ask for the options once, while a webui node answers the catalog job it brings."""
    agent = await s.agent("webui", gpus=1, backends=frozenset({"a1111"}))
    asking = asyncio.create_task(client.get("/sdapi/v1/options"))
    a = await agent.next_assignment()
    await agent.finish(a, {a.jobs[0].job_id: {"catalog.json": json.dumps(CATALOG).encode()}})
    assert (await asking).status_code == 200


async def test_option_posts_are_capped_in_size_and_kind(served: Served) -> None:
    async with webui(served, "mallory") as mallory:
        await with_catalog(served, mallory)
        huge = {"samples_format": "x" * 3_500_000}
        r = await mallory.post("/sdapi/v1/options", json=huge)
        assert r.status_code == 413
        assert "compat.options_max_bytes" in r.json()["detail"]
        r = await mallory.post("/sdapi/v1/options", json={"made_up_option": "x"})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "made_up_option"]
        assert (
            await mallory.post("/sdapi/v1/options", json={"samples_format": "x" * 3000})
        ).status_code == 200
        # Each post is small, but together they would keep more than the cap.
        r = await mallory.post("/sdapi/v1/options", json={"eta_noise": "y" * 2000})
        assert r.status_code == 422
        assert "compat.options_max_bytes" in r.json()["detail"][0]["msg"]
        assert (await mallory.get("/sdapi/v1/options")).json()["eta_noise"] == 0


async def test_only_the_callers_used_last_are_remembered(served: Served) -> None:
    clients = [webui(served, f"user{i}") for i in range(CALLERS + 3)]
    try:
        first, *others = clients
        await with_catalog(served, first)
        assert (
            await first.post("/sdapi/v1/options", json={"samples_format": "jpg"})
        ).status_code == 200
        assert (await first.get("/sdapi/v1/options")).json()["samples_format"] == "jpg"
        for other in others:  # more callers than are kept, each with big options
            r = await other.post("/sdapi/v1/options", json={"samples_format": "z" * 4000})
            assert r.status_code == 200
        # The first caller was used longest ago: forgotten, back to the backend's options.
        assert (await first.get("/sdapi/v1/options")).json()["samples_format"] == "png"
        assert (await others[-1].get("/sdapi/v1/options")).json()["samples_format"] == "z" * 4000
    finally:
        for client in clients:
            await client.aclose()


def test_idle_callers_are_forgotten_but_never_while_their_request_runs() -> None:
    kept = CallerStates(max_callers=10, idle_s=60.0)
    kept.get(("token", "idle"), now=0.0).options["samples_format"] = "jpg"
    busy = kept.get(("token", "busy"), now=0.0)
    busy.running.append(object())  # type: ignore[arg-type]  # a request of it runs
    kept.get(("token", "later"), now=61.0)
    assert kept.get(("token", "idle"), now=61.0).options == {}
    assert kept.get(("token", "busy"), now=61.0) is busy
    assert len(kept) == 3
