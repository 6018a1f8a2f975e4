"""A pipeline's or array's own webhook through a real server and the example receiver, on
SQLite and PostgreSQL: the group's end is posted once, signed, when its last job ends
(succeeded only if every job did); with ``events: all`` each of its jobs' state changes
is posted too, the group as subject; every call is visible in
``GET /v1/{pipelines,arrays}/{id}/deliveries``."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from http_harness import Served, eventually, serve
from test_webhooks import FAST, Running, port, receivers, secret

from corral.server.agentlink.inprocess import StubAgent
from corral.server.services.webhooks import group_body
from corral.server.store.jsontext import dumps
from corral.server.store.tables import webhook_deliveries
from corral.server.store.webhooks import GroupEvent

pytestmark = pytest.mark.anyio
__all__ = ["port", "receivers"]  # fixtures shared with test_webhooks


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path, sections={"webhooks": FAST}) as s:
        yield s


async def listen(served: Served, port: int, started: list[Running]) -> Running:
    r = Running(port, await secret(served))
    started.append(r)
    return r


async def deliveries(served: Served, path: str) -> list[dict[str, Any]]:
    r = await served.admin.get(f"{path}/deliveries")
    assert r.status_code == 200, r.text
    return list(r.json()["deliveries"])


async def settled(served: Served, path: str, count: int) -> list[dict[str, Any]]:
    """The group's deliveries once ``count`` have been made and every one delivered."""

    async def probe() -> list[dict[str, Any]]:
        got = await deliveries(served, path)
        done = len(got) >= count and all(d["state"] == "delivered" for d in got)
        return got if done else []

    return await eventually(probe)


async def run_all(agent: StubAgent, n: int) -> None:
    """Run ``n`` jobs to success on ``agent``, one assignment at a time."""
    while n > 0:
        a = await agent.next_assignment()
        await agent.start(a)
        await agent.finish(a)
        n -= len(a.jobs)


async def test_a_pipeline_s_end_is_posted_once_signed(
    served: Served, port: int, receivers: list[Running]
) -> None:
    got = await listen(served, port, receivers)
    url = f"http://127.0.0.1:{port}/pipe"
    made = await served.admin.post(
        "/v1/pipelines",
        json={
            "steps": {"a": {"kind": "custom"}, "b": {"kind": "custom", "after": ["a"]}},
            "webhook": {"url": url},
        },
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["webhook"] == {"url": url, "events": "end"}
    path = f"/v1/pipelines/{body['id']}"
    agent = await served.agent("gpu-1")
    await run_all(agent, 2)

    (d,) = await settled(served, path, 1)
    assert (d["kind"], d["subject"], d["subject_kind"]) == (
        "pipeline.succeeded",
        body["id"],
        "pipeline",
    )
    await served.plane.webhook_loop.tick()  # another pass over the same events makes none
    assert len(await deliveries(served, path)) == 1
    (event,) = got.events
    assert got.server.refused == 0  # signed with the team's secret
    assert event["id"] == d["id"]
    assert event["type"] == "pipeline.succeeded"
    group = event["group"]
    assert (group["id"], group["kind"], group["state"]) == (body["id"], "pipeline", "succeeded")
    assert group["counts"] == {"succeeded": 2}
    steps = {s["job_id"] for s in body["steps"]}
    assert {(j["id"], j["state"]) for j in event["jobs"]} == {(i, "succeeded") for i in steps}
    assert event["event"]["kind"] == "job.succeeded"  # the last step's end ended it
    for job_id in steps:  # the steps name no webhook of their own
        assert await deliveries(served, f"/v1/jobs/{job_id}") == []
    for job_id in steps:  # the pipeline goes with its last job, and its deliveries too
        assert (await served.admin.delete(f"/v1/jobs/{job_id}")).status_code == 204
    assert (await served.admin.get(f"{path}/deliveries")).status_code == 404
    async with served.plane.rt.db.read() as conn:
        t = webhook_deliveries
        left = await conn.execute(sa.select(sa.func.count()).where(t.c.subject == body["id"]))
        assert left.scalar() == 0


async def test_a_failing_step_ends_the_pipeline_failed(
    served: Served, port: int, receivers: list[Running]
) -> None:
    got = await listen(served, port, receivers)
    made = await served.admin.post(
        "/v1/pipelines",
        json={
            "steps": {
                "a": {"kind": "custom", "max_attempts": 1},
                "b": {"kind": "custom", "after": ["a"]},
            },
            "webhook": {"url": f"http://127.0.0.1:{port}/"},
        },
    )
    body = made.json()
    agent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.fail(a, "CUDA out of memory", retryable=False)

    (d,) = await settled(served, f"/v1/pipelines/{body['id']}", 1)
    assert d["kind"] == "pipeline.failed"
    (event,) = got.events
    assert event["group"]["state"] == "failed"
    assert event["group"]["counts"] == {"cancelled": 1, "failed": 1}
    assert event["event"]["kind"] == "job.cancelled"  # b, cancelled for a: the last to end


async def test_an_array_with_events_all_posts_its_elements_changes(
    served: Served, port: int, receivers: list[Running]
) -> None:
    got = await listen(served, port, receivers)
    made = await served.admin.post(
        "/v1/arrays",
        json={
            "job": {"kind": "custom", "resources": {"gpus": 1}},
            "count": 2,
            "webhook": {"url": f"http://127.0.0.1:{port}/", "events": "all"},
        },
    )
    assert made.status_code == 201, made.text
    body = made.json()
    elements = {j["id"] for j in body["jobs"]}
    agent = await served.agent("gpu-1")
    await run_all(agent, 2)

    # per element: submitted, placed, started, succeeded; the last end is the array's end
    made_calls = await settled(served, f"/v1/arrays/{body['id']}", 8)
    kinds = [d["kind"] for d in made_calls]
    assert kinds[-1] == "array.succeeded"
    assert Counter(kinds[:-1]) == {
        "job.submitted": 2, "job.placed": 2, "job.started": 2, "job.succeeded": 1,
    }  # fmt: skip
    assert {d["subject"] for d in made_calls} == {body["id"]}
    assert {d["subject_kind"] for d in made_calls} == {"array"}
    assert got.server.refused == 0
    assert Counter(e["type"] for e in got.events) == Counter(kinds)  # each once
    changes = [e for e in got.events if e["type"].startswith("job.")]
    for e in changes:
        assert e["group"]["id"] == body["id"]
        assert e["job"]["id"] in elements
        assert e["event"]["job_id"] == e["job"]["id"]
    (end,) = [e for e in got.events if e["type"] == "array.succeeded"]
    assert end["group"]["state"] == "succeeded"
    assert {j["id"] for j in end["jobs"]} == elements


async def test_a_group_webhook_follows_a_job_s_rules(served: Served) -> None:
    steps = {"a": {"kind": "custom"}}
    for url in ("ftp://example.com/x", "https://user:pw@example.com/"):
        r = await served.admin.post("/v1/pipelines", json={"steps": steps, "webhook": {"url": url}})
        assert r.status_code == 422, url
        assert "webhook" in r.text
    r = await served.admin.post(
        "/v1/arrays",
        json={"job": {}, "count": 2, "webhook": {"url": "https://x.io/h", "events": "x"}},
    )
    assert r.status_code == 422
    assert "webhook.events" in r.text or "events" in r.text
    missing = await served.admin.get("/v1/arrays/arr_nothing/deliveries")
    assert missing.status_code == 404


async def test_an_address_inside_the_network_is_refused_for_a_group(tmp_path: Path) -> None:
    async with serve(str(tmp_path / "c.db"), tmp_path) as s:  # allow_private off
        for path, body in [
            ("/v1/pipelines", {"steps": {"a": {}}}),
            ("/v1/arrays", {"job": {}, "count": 2}),
        ]:
            hook = {"url": "http://169.254.169.254/latest"}
            r = await s.admin.post(path, json=body | {"webhook": hook})
            assert r.status_code == 422, r.text
            assert r.json()["field"] == "webhook.url"
            assert "not a public address" in r.text


def test_a_large_group_s_end_lists_as_many_jobs_as_fit() -> None:
    members = [(f"job_{i:020d}", "succeeded") for i in range(5000)]
    event = GroupEvent(9, "job.succeeded", 1.0, members[-1][0], {}, "arr_1", "array", "t",
                       "https://x.io/h", "end")  # fmt: skip
    body = group_body(event, {"succeeded": 5000}, "succeeded", None, members, 4096)
    assert len(dumps(body)) <= 4096
    assert body["jobs_truncated"] is True
    assert 0 < len(body["jobs"]) < 5000
    assert body["jobs"][0] == {"id": members[0][0], "state": "succeeded"}  # the first kept
    assert body["group"]["size"] == 5000
    whole = group_body(event, {"succeeded": 3}, "succeeded", None, members[:3], 4096)
    assert "jobs_truncated" not in whole
    assert len(whole["jobs"]) == 3
