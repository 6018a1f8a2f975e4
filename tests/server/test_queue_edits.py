"""The editable queue over real HTTP: ``PATCH /v1/jobs/{id}`` changes a queued job; a held
job stays queued and is never placed until released; a job moved to the top of its
user's queue runs before that user's older jobs. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import Served, eventually, serve, sse_events

from corral.server.agentlink.base import Assignment

pytestmark = pytest.mark.anyio


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path) as s:
        yield s


async def submit(client: httpx.AsyncClient, **spec: Any) -> str:
    r = await client.post("/v1/jobs", json={"resources": {"gpus": 1}, **spec})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def patch(s: Served, job_id: str, **change: Any) -> dict[str, Any]:
    r = await s.admin.patch(f"/v1/jobs/{job_id}", json=change)
    assert r.status_code == 200, r.text
    return dict(r.json())


def job_of(a: Assignment) -> str:
    (work,) = a.jobs
    return work.job_id


async def test_a_held_job_stays_queued_says_held_and_runs_once_released(served: Served) -> None:
    held = await submit(served.admin, user="ana")
    out = await patch(served, held, hold=True)
    assert out["held"] is True
    assert out["state"] == "queued"
    assert out["queue"]["reasons"][0]["code"] == "held"
    agent = await served.agent("gpu-1")
    other = await submit(served.admin, user="ana")  # younger: runs first, the held one waits
    first = await agent.next_assignment()
    assert job_of(first) == other
    queue = (await served.admin.get("/v1/queue")).json()
    entry = next(e for e in queue["entries"] if e["job"]["id"] == held)
    assert entry["queue"]["reasons"][0]["code"] == "held"
    assert "held" in entry["queue"]["summary"]
    await agent.start(first)
    await agent.finish(first, {other: {"out.txt": b"done"}})

    async def idle_cycles() -> bool:  # the GPU is free again and cycles ran: still held
        job = (await served.admin.get(f"/v1/jobs/{held}")).json()
        return job["state"] == "queued" and served.plane.schedule.kept.queued == 0

    await eventually(idle_cycles)
    assert agent.inbox.empty()
    released = await patch(served, held, hold=False)
    assert released["held"] is False
    second = await agent.next_assignment()
    assert job_of(second) == held
    lines: list[str] = []
    url, kinds = f"/v1/jobs/{held}/events", {"kind": "job.log"}
    async with served.admin.stream("GET", url, params=kinds) as stream:
        async for frame in sse_events(stream):
            lines += frame["data"]["data"]["lines"]
            if len(lines) == 2:
                break
    assert lines[0].startswith("held (by")
    assert lines[1].startswith("released (by")


async def test_top_moves_a_job_before_its_user_s_older_jobs(served: Served) -> None:
    ids = [await submit(served.admin, user="ana") for _ in range(3)]
    await patch(served, ids[2], top=True)
    agent = await served.agent("gpu-1")
    order = []
    for _ in ids:
        a = await agent.next_assignment()
        order.append(job_of(a))
        await agent.start(a)
        await agent.finish(a, {job_of(a): {"o.txt": b"x"}})
    assert order == [ids[2], ids[0], ids[1]]


async def test_patch_changes_class_time_limit_labels_and_refuses_what_it_cannot(
    served: Served,
) -> None:
    job = await submit(served.admin, user="ana", priority="free", labels={"run": "a"})
    out = await patch(served, job, priority="paid", timeout_s=60, labels={"run": "b", "x": "1"})
    assert (out["priority"], out["timeout_s"], out["labels"]) == (
        "paid",
        60,
        {"run": "b", "x": "1"},
    )
    again = (await served.admin.get(f"/v1/jobs/{job}")).json()
    assert again["labels"] == {"run": "b", "x": "1"}
    assert again["payload"] == {}
    r = await served.admin.patch(f"/v1/jobs/{job}", json={"priority": "gold"})
    assert r.status_code == 422
    assert r.json()["field"] == "priority"
    r = await served.admin.patch(f"/v1/jobs/{job}", json={"timeout_s": -1})
    assert r.status_code == 422
    assert "timeout_s" in r.text
    r = await served.admin.patch(f"/v1/jobs/{job}", json={})
    assert r.status_code == 422
    r = await served.admin.patch(f"/v1/jobs/{job}", json={"user_weight": 0, "hold": True})
    assert r.status_code == 422
    assert r.json()["field"] == "user_weight"
    assert (await served.admin.get(f"/v1/jobs/{job}")).json()["held"] is False  # all or none
    made = await served.admin.post("/v1/tokens", json={"kind": "team", "name": "b", "team": "b"})
    async with served.client(made.json()["token"]) as other_team:
        r = await other_team.patch(f"/v1/jobs/{job}", json={"hold": True})
        assert r.status_code == 404  # another team's job does not exist for it
        r = await other_team.patch(f"/v1/jobs/{job}", json={"user_weight": 3})
        assert r.status_code == 403  # a user's weight is the administrator's to set
    before = (await served.admin.get("/v1/policy")).json()["version"]
    out = await patch(served, job, user_weight=3, hold=True)
    assert out["held"] is True
    policy = (await served.admin.get("/v1/policy")).json()
    assert policy["version"] == before + 1, "a user's weight is a new policy version"
    assert policy["policy"]["user_weights"] == {"ana": 3}
    assert "ana's weight set to 3" in policy["note"]
    await patch(served, job, hold=False)
    agent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    r = await served.admin.patch(f"/v1/jobs/{job}", json={"priority": "free"})
    assert r.status_code == 409
    assert "only a queued job" in r.json()["message"]
