"""Attack: one team token floods the server with work (issue 45, item 5).

One team token queued 22,000 jobs in seconds. Now every team token has rate
limits (token buckets: requests, and jobs submitted, a batch counting each of
its jobs), and every team caps on queued jobs and on result bytes stored;
the drop-in AUTOMATIC1111 and ComfyUI APIs submit under the same limits.
Past a rate or the queue cap: 429 with Retry-After; at the bytes cap: 403.
Each message names the limit and its setting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import Served, eventually, serve

from corral.sdk import AsyncClient, TooManyRequests

pytestmark = pytest.mark.anyio

SLOW = 0.001  # per second: nothing refills while a test runs
JOB = {"kind": "sample", "resources": {"gpus": 1}}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    limits = {
        "submit_jobs_per_s": SLOW,
        "submit_burst": 10,
        "requests_per_s": SLOW,
        "requests_burst": 40,
    }
    sections = {"limits": limits, "compat": {"catalog_timeout_s": 0.5}}
    async with serve(str(tmp_path / "c.db"), tmp_path, sections=sections) as s:
        yield s


@pytest.fixture
async def opened() -> AsyncIterator[list[httpx.AsyncClient]]:
    """The team clients a test made, closed after it."""
    clients: list[httpx.AsyncClient] = []
    yield clients
    for client in clients:
        await client.aclose()


async def team_client(s: Served, team: str, opened: list[httpx.AsyncClient]) -> httpx.AsyncClient:
    """A client with a new token of ``team``."""
    body = {"kind": "team", "team": team, "name": f"{team}-app"}
    r = await s.admin.post("/v1/tokens", json=body)
    assert r.status_code == 201, r.text
    opened.append(s.client(r.json()["token"]))
    return opened[-1]


def refused(r: httpx.Response, status: int, setting: str) -> None:
    assert r.status_code == status, r.text
    assert setting in r.text
    if status == 429:
        assert int(r.headers["Retry-After"]) >= 1


async def test_a_team_token_submits_at_most_its_burst_and_a_batch_counts_each_job(
    served: Served, opened: list[httpx.AsyncClient]
) -> None:
    flood = await team_client(served, "flood", opened)
    codes = [(await flood.post("/v1/jobs", json=JOB)).status_code for _ in range(12)]
    assert codes == [201] * 10 + [429] * 2
    refused(await flood.post("/v1/jobs", json=JOB), 429, "limits.submit_jobs_per_s")
    batcher = await team_client(served, "batcher", opened)
    assert (await batcher.post("/v1/jobs/batch", json={"jobs": [JOB] * 6})).status_code == 201
    batch = await batcher.post("/v1/jobs/batch", json={"jobs": [JOB] * 5})
    refused(batch, 429, "limits.submit_burst")  # 6 + 5 jobs: over the burst of 10
    too_big = await batcher.post("/v1/jobs/batch", json={"jobs": [JOB] * 11})
    refused(too_big, 422, "limits.submit_burst")
    # Another team's token, and the admin, are not held back by this one.
    calm = await team_client(served, "calm", opened)
    assert (await calm.post("/v1/jobs", json=JOB)).status_code == 201
    assert (await served.admin.post("/v1/jobs", json=JOB)).status_code == 201


async def test_the_drop_in_apis_submit_under_the_same_rate_limit(
    served: Served, opened: list[httpx.AsyncClient]
) -> None:
    await served.agent("webui", backends=frozenset({"a1111", "comfyui"}))
    flood = await team_client(served, "flood", opened)
    for _ in range(10):
        assert (await flood.post("/v1/jobs", json=JOB)).status_code == 201
    a1111 = await flood.post("/sdapi/v1/txt2img", json={"prompt": "a barn", "steps": 2})
    refused(a1111, 429, "limits.submit_jobs_per_s")
    prompt = {"1": {"class_type": "SaveImage", "inputs": {"filename_prefix": "x"}}}
    comfy = await flood.post("/prompt", json={"prompt": prompt})
    refused(comfy, 429, "limits.submit_jobs_per_s")


async def test_the_sdk_says_how_long_to_wait(served: Served) -> None:
    body = {"kind": "team", "team": "sdk", "name": "sdk-app"}
    token = (await served.admin.post("/v1/tokens", json=body)).json()
    async with AsyncClient(served.base_url, token["token"]) as client:
        for _ in range(10):
            await client.submit(kind="sample")
        with pytest.raises(TooManyRequests) as refusal:
            await client.submit(kind="sample")
    assert refusal.value.retry_after is not None
    assert refusal.value.retry_after >= 1
    assert "limits.submit_jobs_per_s" in refusal.value.message


async def test_every_request_of_a_team_token_counts_toward_its_rate(
    served: Served, opened: list[httpx.AsyncClient]
) -> None:
    chatty = await team_client(served, "chatty", opened)
    codes = [(await chatty.get("/v1/jobs")).status_code for _ in range(41)]
    assert codes[:40] == [200] * 40
    assert codes[40] == 429
    refused(await chatty.get("/sdapi/v1/progress"), 429, "limits.requests_per_s")
    quiet = await team_client(served, "quiet", opened)
    assert (await quiet.get("/v1/jobs")).status_code == 200
    assert (await chatty.get("/healthz")).status_code == 200  # no token: not counted


@pytest.fixture
async def capped(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    """On SQLite and PostgreSQL (the result bytes are summed by each one's JSON functions)."""
    quotas = {
        "max_queued_jobs": 5,
        "max_stored_bytes": 1000,
        "usage_refresh_s": 0.2,
        "teams": {"big": {"max_queued_jobs": 8}},
    }
    async with serve(db_url, tmp_path, sections={"quotas": quotas}) as s:
        yield s


async def test_a_team_may_keep_so_many_jobs_queued(
    capped: Served, opened: list[httpx.AsyncClient]
) -> None:
    team = await team_client(capped, "busy", opened)
    wave = await asyncio.gather(*(team.post("/v1/jobs", json=JOB) for _ in range(9)))
    codes = sorted(r.status_code for r in wave)
    assert codes == [201] * 5 + [429] * 4  # concurrent submissions cannot slip past together
    refused(await team.post("/v1/jobs", json=JOB), 429, "quotas.max_queued_jobs")
    batch = await team.post("/v1/jobs/batch", json={"jobs": [JOB] * 2})
    refused(batch, 429, "quotas.max_queued_jobs")
    big = await team_client(capped, "big", opened)  # its own cap
    codes = [(await big.post("/v1/jobs", json=JOB)).status_code for _ in range(9)]
    assert codes == [201] * 8 + [429]
    # As queued jobs leave the queue (they start, or are cancelled), there is room again.
    queued = next(r.json()["id"] for r in wave if r.status_code == 201)
    assert (await team.post(f"/v1/jobs/{queued}/cancel")).status_code == 200

    async def accepted() -> bool:
        return (await team.post("/v1/jobs", json=JOB)).status_code == 201

    await eventually(accepted)


async def test_a_retried_submission_at_the_cap_returns_its_job(
    capped: Served, opened: list[httpx.AsyncClient]
) -> None:
    team = await team_client(capped, "retry", opened)
    key = {"Idempotency-Key": "order-1"}
    first = await team.post("/v1/jobs", json=JOB, headers=key)
    for _ in range(4):
        assert (await team.post("/v1/jobs", json=JOB)).status_code == 201
    again = await team.post("/v1/jobs", json=JOB, headers=key)
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


async def test_a_team_over_its_stored_bytes_submits_no_more_until_it_deletes(
    capped: Served, opened: list[httpx.AsyncClient]
) -> None:
    team = await team_client(capped, "hoard", opened)
    job: dict[str, Any] = (await team.post("/v1/jobs", json=JOB)).json()
    agent = await capped.agent("gpu-1", gpus=1)
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.finish(a, {job["id"]: {"big.png": b"x" * 600, "bigger.png": b"y" * 600}})

    async def refused_for_bytes() -> httpx.Response | None:
        r = await team.post("/v1/jobs", json=JOB)
        return r if r.status_code == 403 else None

    over = await eventually(refused_for_bytes)
    refused(over, 403, "quotas.max_stored_bytes")
    assert over.json()["error"] == "quota_exceeded"
    assert (await team.delete(f"/v1/jobs/{job['id']}")).status_code == 204

    async def accepted() -> bool:
        return (await team.post("/v1/jobs", json=JOB)).status_code == 201

    await eventually(accepted)
