"""The HTTP API over real HTTP (uvicorn on loopback), on SQLite and PostgreSQL.

The control plane's loops run for real; agents are stub agents in the same
process, so placement -> start -> progress -> preview -> finish is seen
through the API exactly as a web app would see it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from http_harness import Served, eventually, serve, sse_events

pytestmark = pytest.mark.anyio


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    """On SQLite and PostgreSQL: for what depends on the store (ordering, constraints, txs)."""
    async with serve(db_url, tmp_path, max_body_bytes=64 * 1024, max_batch_jobs=10) as s:
        yield s


@pytest.fixture
async def served_sqlite(tmp_path: Path) -> AsyncIterator[Served]:
    """On SQLite only: for the HTTP layer itself (validation, limits, routing)."""
    async with serve(str(tmp_path / "c.db"), tmp_path, max_body_bytes=64 * 1024) as s:
        yield s


async def submit(s: Served, **spec: Any) -> dict[str, Any]:
    r = await s.admin.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_submit_get_and_the_scheduler_s_reasons(served_sqlite: Served) -> None:
    job = await submit(
        served_sqlite, kind="sample", resources={"gpus": 1, "vram": "12GiB"}, user="ana"
    )
    assert job["state"] == "queued"
    assert job["resources"]["vram_bytes"] == 12 * 1024**3

    async def reasons() -> dict[str, Any] | None:
        got = (await served_sqlite.admin.get(f"/v1/jobs/{job['id']}")).json()
        return got if got["queue"]["remedy"] else None

    got = await eventually(reasons)
    assert got["queue"]["reasons"][0]["code"]
    assert got["queue"]["summary"]
    # no node at all: never runnable, and the queue names what to start
    assert got["queue"]["remedy"] == "none"
    assert "start an agent" in got["queue"]["advice"]
    queue = (await served_sqlite.admin.get("/v1/queue")).json()
    assert queue["total"] == 1
    assert queue["entries"][0]["job"]["id"] == job["id"]


async def test_a_gpu_job_on_cpu_only_nodes_is_told_no_node_has_a_gpu(
    served_sqlite: Served,
) -> None:
    await served_sqlite.agent("cpu-box", gpus=0)
    job = await submit(served_sqlite, kind="sample", resources={"gpus": 1})

    async def advice() -> str | None:
        got = (await served_sqlite.admin.get(f"/v1/jobs/{job['id']}")).json()
        return got["queue"]["advice"] if got["queue"]["remedy"] else None

    said = await eventually(advice)
    assert said is not None
    assert said.startswith("no node has a GPU: start an agent with --fake-gpus"), said


async def test_idempotency_key_returns_the_same_job(served: Served) -> None:
    body = {"kind": "sample", "payload": {"prompt": "x"}}
    headers = {"Idempotency-Key": "req-1"}
    first = await served.admin.post("/v1/jobs", json=body, headers=headers)
    again = await served.admin.post("/v1/jobs", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    other = await served.admin.post(
        "/v1/jobs", json={**body, "payload": {"prompt": "y"}}, headers=headers
    )
    assert other.status_code == 409
    assert "Idempotency-Key" in other.json()["message"]
    listed = (await served.admin.get("/v1/jobs")).json()["jobs"]
    assert len(listed) == 1


async def test_batch_is_all_or_nothing(served: Served) -> None:
    good = {"jobs": [{"kind": "sample"} for _ in range(3)]}
    r = await served.admin.post("/v1/jobs/batch", json=good, headers={"Idempotency-Key": "b1"})
    assert r.status_code == 201
    assert len(r.json()["jobs"]) == 3
    replay = await served.admin.post("/v1/jobs/batch", json=good, headers={"Idempotency-Key": "b1"})
    assert replay.status_code == 200
    assert [j["id"] for j in replay.json()["jobs"]] == [j["id"] for j in r.json()["jobs"]]

    bad = {"jobs": [{"kind": "sample"}, {"kind": "sample"}, {"priority": "nope"}]}
    r = await served.admin.post("/v1/jobs/batch", json=bad)
    assert r.status_code == 422
    assert r.json()["field"] == "jobs[2].priority"
    too_many = {"jobs": [{} for _ in range(11)]}
    r = await served.admin.post("/v1/jobs/batch", json=too_many)
    assert r.status_code == 422
    assert r.json()["field"] == "jobs"
    assert len((await served.admin.get("/v1/jobs")).json()["jobs"]) == 3


@pytest.mark.parametrize(
    ("body", "want_field"),
    [
        ({"resources": {"gpus": -1}}, "resources.gpus"),
        ({"resources": {"gpus": 1.5}}, "resources.gpus"),
        ({"resources": {"vram": "12 potatoes"}}, "resources.vram"),
        ({"kind": "dance"}, "kind"),
        ({"replicas": 0}, "replicas"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"colour": "red"}, "colour"),
        ({"priority": "urgent"}, "priority"),
        ({"team": "../etc"}, "team"),
        ({"user": "a\x00b"}, "user"),
        ({"payload": {"k": ["\x00"]}}, "payload"),
        ({"resources": {"vram": "9000000 TiB"}}, "resources.vram"),
        ({"resources": {"cpus": -1}}, "resources.cpus"),
        ({"resources": {"cpus": "five"}}, "resources.cpus"),
        ({"resources": {"cpus": 0.0005}}, "resources.cpus"),
        ({"resources": {"cpus": 5000}}, "resources.cpus"),
    ],
    ids=[
        "negative-gpus",
        "fractional-gpus-above-one",
        "bad-vram",
        "unknown-kind",
        "no-replicas",
        "zero-timeout",
        "unknown-field",
        "unknown-priority",
        "bad-team-name",
        "nul-in-user",
        "nul-in-payload",
        "absurd-vram",
        "negative-cpus",
        "cpus-in-words",
        "cpus-finer-than-a-milli-cpu",
        "absurd-cpus",
    ],
)
async def test_bad_input_is_a_422_naming_the_field(
    served_sqlite: Served, body: dict[str, Any], want_field: str
) -> None:
    r = await served_sqlite.admin.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == want_field
    assert want_field in r.json()["message"]


@pytest.mark.parametrize("cpus", [0.5, "0.5", "500m"])
async def test_fractional_cpus_are_accepted(served_sqlite: Served, cpus: float | str) -> None:
    job = await submit(served_sqlite, resources={"gpus": 0, "cpus": cpus})
    assert job["resources"]["cpus"] == 0.5


async def test_malformed_json_and_bad_query_are_422(served_sqlite: Served) -> None:
    r = await served_sqlite.admin.post(
        "/v1/jobs", content=b'{"payload": {"x": NaN}}', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["field"] == "payload"
    r = await served_sqlite.admin.post(
        "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["field"] == "body"
    r = await served_sqlite.admin.get("/v1/jobs", params={"limit": 0})
    assert r.status_code == 422
    assert r.json()["field"] == "limit"
    r = await served_sqlite.admin.get("/v1/jobs", params={"cursor": "garbage!"})
    assert r.status_code == 422
    assert r.json()["field"] == "cursor"
    r = await served_sqlite.admin.get("/v1/jobs/a%00b")
    assert r.status_code == 422
    assert r.json()["field"] == "url"
    r = await served_sqlite.admin.get("/v1/events/export", params={"after": 2**63})
    assert r.status_code == 422
    assert r.json()["field"] == "after"


async def test_submit_checks_token_then_every_field_at_once(served_sqlite: Served) -> None:
    """POST /v1/jobs gathers its arguments by hand (api/direct.py): the same answers."""
    s = served_sqlite
    bad = {"resources": {"gpus": -1}}
    async with s.client(None) as stranger:
        anonymous = await stranger.post("/v1/jobs", json=bad)
        assert anonymous.status_code == 401  # the token first: nothing is parsed for a stranger
        assert anonymous.headers["www-authenticate"] == "Bearer"
        basic = await stranger.post("/v1/jobs", json={}, headers={"Authorization": "Basic eDp5"})
        assert basic.status_code == 401
    both = await s.admin.post("/v1/jobs", json=bad, headers={"Idempotency-Key": "k" * 201})
    assert both.status_code == 422
    fields = [f["field"] for f in both.json()["fields"]]
    assert fields == ["Idempotency-Key header", "resources.gpus"]
    untyped = await s.admin.post("/v1/jobs", content=b"{}", headers={"content-type": "text/plain"})
    assert untyped.status_code == 422
    assert untyped.json()["field"] == "body"
    assert "Content-Type: application/json" in untyped.json()["message"]
    empty = await s.admin.post("/v1/jobs")
    assert (empty.status_code, empty.json()["field"]) == (422, "body")
    ok = await s.admin.post(
        "/v1/jobs", content=b"{}", headers={"content-type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 201, ok.text
    listed = (await s.admin.get("/v1/jobs")).json()["jobs"]
    assert [j["id"] for j in listed] == [ok.json()["id"]]  # what was refused left nothing


async def test_oversize_bodies_get_413_and_leave_nothing(served_sqlite: Served) -> None:
    big = {"payload": {"blob": "x" * 70_000}}
    r = await served_sqlite.admin.post("/v1/jobs", json=big)
    assert r.status_code == 413
    assert "limit" in r.json()["message"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"payload": {"blob": "'
        for _ in range(10):
            yield b"y" * 10_000
        yield b'"}}'

    r = await served_sqlite.admin.post(
        "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert (await served_sqlite.admin.get("/v1/jobs")).json()["jobs"] == []


async def test_list_pages_with_cursors_and_filters(served: Served) -> None:
    ids = [(await submit(served, user=f"u{i % 2}"))["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await served.admin.get("/v1/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    u1 = (await served.admin.get("/v1/jobs", params={"user": "u1"})).json()["jobs"]
    assert [j["id"] for j in u1] == [ids[3], ids[1]]
    queued = (await served.admin.get("/v1/jobs", params={"state": ["queued", "running"]})).json()
    assert len(queued["jobs"]) == 5
    none = (await served.admin.get("/v1/jobs", params={"state": "succeeded"})).json()
    assert none["jobs"] == []


async def test_list_filters_by_kind_priority_node_time_and_id(served: Served) -> None:
    placed = await submit(served, kind="sample", resources={"gpus": 1})
    agent = await served.agent("gpu-1")
    await agent.start(await agent.next_assignment())
    custom = await submit(served, priority="batch", resources={"gpus": 64})  # stays queued
    later = custom["submitted_at"]

    async def ids(**params: Any) -> list[str]:
        reply = await served.admin.get("/v1/jobs", params=params)
        assert reply.status_code == 200, reply.text
        return [j["id"] for j in reply.json()["jobs"]]

    assert await ids(kind="sample") == [placed["id"]]
    assert await ids(priority="batch") == [custom["id"]]
    assert await ids(node="gpu-1") == [placed["id"]]
    assert await ids(since=later) == [custom["id"]]
    assert await ids(until=later) == [placed["id"]]
    assert await ids(q=custom["id"][:-2]) == [custom["id"]]
    assert await ids(q="job_%") == []  # a wildcard matches itself only
    assert await ids(interrupted="false", kind="sample") == [placed["id"]]
    bad = await served.admin.get("/v1/jobs", params={"kind": "nonsense"})
    assert bad.status_code == 422
    assert "kind" in bad.text


async def test_list_filters_by_model(served: Served) -> None:
    sdxl = await submit(served, model="sdxl-base")
    await submit(served, model="flux-dev")
    await submit(served)
    page = (await served.admin.get("/v1/jobs", params={"model": "sdxl-base"})).json()
    assert [j["id"] for j in page["jobs"]] == [sdxl["id"]]
    assert (await served.admin.get("/v1/jobs", params={"model": "sd"})).json()["jobs"] == []
    long = await served.admin.get("/v1/jobs", params={"model": "m" * 300})
    assert long.status_code == 422
    assert "model" in long.text


async def test_a_job_seen_live_over_sse_from_placement_to_result(served: Served) -> None:
    job = await submit(served, kind="sample", resources={"gpus": 1})
    frames: list[dict[str, Any]] = []
    async with served.admin.stream("GET", f"/v1/jobs/{job['id']}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        agent = await served.agent("gpu-1")
        a = await agent.next_assignment()
        await agent.start(a)
        await agent.progress(a, 0.5, "halfway")
        await agent.preview(a, job["id"], b"\x89PNG preview")
        await agent.log(a, "sampling")
        await agent.finish(a, {job["id"]: {"image.png": b"\x89PNG final"}})
        async for frame in sse_events(stream):
            frames.append(frame)
    kinds = [f["event"] for f in frames]
    assert kinds == [
        "job.submitted",
        "job.placed",
        "job.started",
        "job.progress",
        "job.preview",
        "job.log",
        "job.succeeded",
    ]
    assert [int(f["id"]) for f in frames] == sorted(int(f["id"]) for f in frames)
    preview_url = frames[4]["data"]["data"]["url"]
    preview = await served.admin.get(preview_url)
    assert preview.status_code == 200
    assert preview.content == b"\x89PNG preview"
    assert preview.headers["content-type"] == "image/png"

    result = (await served.admin.get(f"/v1/jobs/{job['id']}/result")).json()
    assert result["state"] == "succeeded"
    assert [f["name"] for f in result["files"]] == ["image.png"]
    blob = await served.admin.get(result["files"][0]["url"])
    assert blob.content == b"\x89PNG final"

    # Resuming after the "started" event replays only what came after it.
    started_id = frames[2]["id"]
    async with served.admin.stream(
        "GET", f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": started_id}
    ) as stream:
        resumed = [f["event"] async for f in sse_events(stream)]
    assert resumed == kinds[3:]


async def test_event_streams_keep_only_the_kinds_asked_for(served: Served) -> None:
    job = await submit(served, resources={"gpus": 1})
    agent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.progress(a, 0.5, "halfway")
    await agent.finish(a)
    wanted = {"kind": ["job.started", "job.succeeded"]}
    # One job's stream: only those kinds, and it still ends after the job's final event.
    async with served.admin.stream("GET", f"/v1/jobs/{job['id']}/events", params=wanted) as r:
        assert [f["event"] async for f in sse_events(r)] == ["job.started", "job.succeeded"]
    # The ended job's stream with a filter that excludes its end still ends.
    only = {"kind": ["job.progress"]}
    async with served.admin.stream("GET", f"/v1/jobs/{job['id']}/events", params=only) as r:
        assert [f["data"]["data"] async for f in sse_events(r)] == [
            {"progress": 0.5, "message": "halfway"}
        ]
    # Every event: submitted, placed and progress are read past, never sent.
    seen: list[str] = []
    async with served.admin.stream("GET", "/v1/events", params={**wanted, "after": 0}) as r:
        async for frame in sse_events(r):
            seen.append(frame["event"])
            if frame["event"] == "job.succeeded":
                break
    assert seen == ["job.started", "job.succeeded"]
    bad = await served.admin.get("/v1/events", params={"kind": "job.exploded"})
    assert bad.status_code == 422
    assert bad.json()["field"] == "kind[0]"  # the first ?kind= is not an event kind


async def test_a_client_leaving_an_event_stream_ends_it_on_the_server(served: Served) -> None:
    async def open_streams() -> float:
        text = (await served.admin.get("/metrics")).text
        line = next(x for x in text.splitlines() if x.startswith("corral_event_streams "))
        return float(line.split()[1])

    async def streams_are(n: float) -> bool:
        return await open_streams() == n

    job = await submit(served, resources={"gpus": 1})
    assert await open_streams() == 0
    async with (
        served.admin.stream("GET", "/v1/events") as every,
        served.admin.stream("GET", f"/v1/jobs/{job['id']}/events") as one,
    ):
        assert one.status_code == every.status_code == 200
        await eventually(lambda: streams_are(2))
    # Both clients left while nothing was being sent: the server notices and lets go.
    await eventually(lambda: streams_are(0))


async def test_cancel_and_interrupt_over_http(served_sqlite: Served) -> None:
    queued = await submit(served_sqlite, resources={"gpus": 1})
    r = await served_sqlite.admin.post(f"/v1/jobs/{queued['id']}/cancel")
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"
    running = await submit(served_sqlite, resources={"gpus": 1})
    agent = await served_sqlite.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    r = await served_sqlite.admin.post(f"/v1/jobs/{running['id']}/interrupt")
    assert r.status_code == 200
    assert r.json()["state"] == "running"
    stop = await agent.receive()
    assert stop.reason.value == "interrupt"  # type: ignore[union-attr]
    await agent.finish(a, {running["id"]: {"partial.png": b"half"}})
    done = (await served_sqlite.admin.get(f"/v1/jobs/{running['id']}")).json()
    assert done["state"] == "succeeded"
    assert done["result"][0]["name"] == "partial.png"
    r = await served_sqlite.admin.post(f"/v1/jobs/{running['id']}/cancel")
    assert r.status_code == 409
    r = await served_sqlite.admin.post("/v1/jobs/job_nope/cancel")
    assert r.status_code == 404


async def test_nodes_pause_resume_drain(served_sqlite: Served) -> None:
    await served_sqlite.agent("gpu-1", gpus=2)
    nodes = (await served_sqlite.admin.get("/v1/nodes")).json()
    assert [(n["name"], n["state"], len(n["gpus"])) for n in nodes] == [("gpu-1", "ready", 2)]
    r = await served_sqlite.admin.post("/v1/nodes/gpu-1/pause")
    assert r.json()["paused"] is True
    assert r.json()["schedulable"] is False
    r = await served_sqlite.admin.post("/v1/nodes/gpu-1/drain")
    assert r.json()["draining"] is True
    r = await served_sqlite.admin.post("/v1/nodes/gpu-1/resume")
    assert (r.json()["paused"], r.json()["draining"]) == (False, False)
    assert served_sqlite.link.sent.intake == [("gpu-1", False), ("gpu-1", False), ("gpu-1", True)]
    assert (await served_sqlite.admin.post("/v1/nodes/nope/pause")).status_code == 404


async def test_teams_put_and_get(served_sqlite: Served) -> None:
    r = await served_sqlite.admin.put(
        "/v1/teams/vision", json={"quota_gpus": 4, "borrow_limit_gpus": 2, "weight": 2}
    )
    assert r.status_code == 200
    teams = {t["name"]: t for t in (await served_sqlite.admin.get("/v1/teams")).json()}
    assert teams["vision"] == {
        "name": "vision",
        "quota_gpus": 4.0,
        "borrow_limit_gpus": 2.0,
        "weight": 2.0,
    }
    r = await served_sqlite.admin.put("/v1/teams/vision", json={"weight": 0})
    assert r.status_code == 422
    assert r.json()["field"] == "weight"


async def test_health_metrics_and_trace_export(served_sqlite: Served) -> None:
    assert (await served_sqlite.admin.get("/healthz")).json() == {"status": "ok"}
    await submit(served_sqlite, priority="paid", team="vision")
    metrics = (await served_sqlite.admin.get("/metrics")).text
    assert 'corral_jobs_submitted_total{priority="paid",team="vision"} 1.0' in metrics
    lines = (await served_sqlite.admin.get("/v1/events/export")).text.splitlines()
    import json

    events = [json.loads(line) for line in lines]
    assert events[0]["kind"] == "job.submitted"
    assert events[0]["team"] == "vision"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)


async def test_openapi_documents_every_route(served_sqlite: Served) -> None:
    spec = (await served_sqlite.admin.get("/openapi.json")).json()
    paths = set(spec["paths"])
    assert {
        "/v1/jobs",
        "/v1/jobs/batch",
        "/v1/jobs/{job_id}/events",
        "/v1/queue",
        "/v1/nodes/{name}/drain",
        "/v1/teams/{name}",
        "/v1/tokens",
        "/v1/events/export",
        "/healthz",
        "/metrics",
    } <= paths
    assert (await served_sqlite.admin.get("/docs")).status_code == 200


async def test_swagger_ui_is_served_from_the_package_with_no_cdn(served_sqlite: Served) -> None:
    """``/docs`` loads its script and style from this server, so it works offline."""
    import re

    page = (await served_sqlite.admin.get("/docs")).text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets), assets
    assert any(a.endswith("swagger-ui.css") for a in assets), assets
    for asset in assets:
        assert asset.startswith("/"), f"{asset} is not served by corral"
        reply = await served_sqlite.admin.get(asset)
        assert reply.status_code == 200, asset
        assert len(reply.content) > 500, asset  # the real file, not an error page


async def test_the_event_log_exports_as_a_trace_corral_sim_reads(
    served_sqlite: Served, tmp_path: Path
) -> None:
    from corral.core.model import DEFAULT_PRIORITY_CLASSES
    from corral.sim.fields import JobParser
    from corral.sim.traces import read_trace

    s = served_sqlite
    ran = await submit(s, resources={"gpus": 1, "vram": "8GiB"}, team="vision", user="ana")
    waiting = await submit(s, resources={"gpus": 0.5}, priority="batch")
    agent = await s.agent("gpu-1", gpus=1)
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.finish(a)
    r = await s.admin.get("/v1/events/export", params={"format": "sim"})
    assert r.status_code == 200
    trace = tmp_path / "trace.jsonl"
    trace.write_text(r.text)
    parser = JobParser([c.name for c in DEFAULT_PRIORITY_CLASSES], None)
    jobs = list(read_trace(trace, parser))
    assert [j.job.id for j in jobs] == [ran["id"], waiting["id"]]
    first, second = jobs
    assert (first.job.team, first.job.user, first.job.resources.vram_bytes) == (
        "vision",
        "ana",
        8 * 1024**3,
    )
    assert first.duration is not None
    assert first.duration >= 0
    assert (second.job.resources.gpu_milli, second.duration, second.job.priority) == (
        500,
        None,
        "batch",
    )
    assert first.submit_at == 0.0
    assert second.submit_at >= 0.0
