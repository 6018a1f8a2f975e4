"""How a job ended and what ran, over real HTTP, on SQLite and PostgreSQL.

An interrupted job says so (``interrupted``) in its JSON, its list entry and its
final event: ``succeeded`` with the partial result it made, or ``cancelled`` when
it made nothing (before it started, or stopped before it saved a file). What the
agent filled in where the request left it open (the model a backend had loaded, a
drawn seed) is the job's ``ran``, not only a log line. The agent is the in-process
stub link, reporting as a real one does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from http_harness import Served, serve, sse_events

pytestmark = pytest.mark.anyio


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path) as s:
        yield s


async def submit(s: Served) -> str:
    r = await s.admin.post("/v1/jobs", json={"kind": "sample", "resources": {"gpus": 1}})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def final_event(s: Served, job_id: str) -> dict[str, Any]:
    async with s.admin.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        frames = [frame async for frame in sse_events(response)]
    return dict(frames[-1])


async def test_an_interrupted_job_succeeds_with_its_partial_result_and_says_so(
    served: Served,
) -> None:
    job_id = await submit(served)
    agent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    assert (await served.admin.post(f"/v1/jobs/{job_id}/interrupt")).json()["interrupted"] is False
    await agent.receive()  # the stop order
    ran = {"model": "tiny-sd [3c4f]", "seed": "1234"}
    await agent.finish(a, {job_id: {"partial.png": b"half"}}, modified=ran)
    job = (await served.admin.get(f"/v1/jobs/{job_id}")).json()
    assert (job["state"], job["interrupted"]) == ("succeeded", True)
    assert [f["name"] for f in job["result"]] == ["partial.png"]
    assert job["ran"] == ran  # what the agent filled in: kept, not only logged
    listed = (await served.admin.get("/v1/jobs")).json()["jobs"]
    assert [(j["id"], j["interrupted"]) for j in listed] == [(job_id, True)]
    last = await final_event(served, job_id)
    assert last["event"] == "job.succeeded"
    assert last["data"]["data"]["interrupted"] is True
    assert last["data"]["data"]["ran"] == ran


async def test_an_interrupted_job_that_saved_nothing_ends_cancelled(served: Served) -> None:
    job_id = await submit(served)
    agent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    await served.admin.post(f"/v1/jobs/{job_id}/interrupt")
    await agent.receive()
    await agent.finish(a, {job_id: {}})  # stopped before it saved anything (ComfyUI does so)
    job = (await served.admin.get(f"/v1/jobs/{job_id}")).json()
    assert (job["state"], job["interrupted"], job["result"]) == ("cancelled", True, [])
    assert job["error"] == "interrupted before it saved anything"
    last = await final_event(served, job_id)
    assert (last["event"], last["data"]["data"]["interrupted"]) == ("job.cancelled", True)


async def test_a_job_interrupted_before_it_started_is_cancelled_and_interrupted(
    served: Served,
) -> None:
    job_id = await submit(served)  # no node: it waits in the queue
    r = await served.admin.post(f"/v1/jobs/{job_id}/interrupt")
    assert (r.json()["state"], r.json()["interrupted"]) == ("cancelled", True)
    assert r.json()["error"] == "interrupted before it started"
    cancelled = await submit(served)
    r = await served.admin.post(f"/v1/jobs/{cancelled}/cancel")
    assert (r.json()["state"], r.json()["interrupted"]) == ("cancelled", False)


async def test_a_job_that_ran_to_its_end_is_not_interrupted_and_keeps_what_ran(
    served: Served,
) -> None:
    job_id = await submit(served)
    agent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.finish(a, modified={"sampler_name": "Euler a"})
    job = (await served.admin.get(f"/v1/jobs/{job_id}")).json()
    assert (job["state"], job["interrupted"]) == ("succeeded", False)
    assert job["ran"] == {"sampler_name": "Euler a"}
    other = await submit(served)
    b = await agent.next_assignment()
    await agent.start(b)
    await agent.finish(b)  # the agent chose nothing: nothing to say
    assert (await served.admin.get(f"/v1/jobs/{other}")).json()["ran"] is None
