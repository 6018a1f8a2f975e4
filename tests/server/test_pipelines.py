"""Pipelines, dependencies and job arrays over HTTP against the real server with stub agents,
on SQLite and PostgreSQL: steps wait for the steps they need, read their result files as
inputs, are cancelled with the reason when one fails, and a group is read, cancelled and
reprioritised as one."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import Served, eventually, serve

from corral.server.agentlink.base import Assignment
from corral.server.agentlink.inprocess import StubAgent

pytestmark = pytest.mark.anyio
PNG = b"\x89PNG not really, but bytes all the same"


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path) as s:
        yield s


def step(**kw: Any) -> dict[str, Any]:
    return {"kind": "custom", **kw}


async def state(client: httpx.AsyncClient, job_id: str) -> str:
    return str((await client.get(f"/v1/jobs/{job_id}")).json()["state"])


async def until(client: httpx.AsyncClient, job_id: str, want: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/v1/jobs/{job_id}")).json()
        return body if body["state"] == want else None

    return await eventually(probe)


async def pipeline(served: Served, steps: dict[str, Any]) -> httpx.Response:
    return await served.admin.post("/v1/pipelines", json={"steps": steps})


def ids(body: dict[str, Any]) -> dict[str, str]:
    return {s["name"]: s["job_id"] for s in body["steps"]}


async def test_a_step_reads_the_file_the_step_before_made(served: Served) -> None:
    agent = await served.agent("gpu-1")
    made = await pipeline(
        served,
        {
            "upscale": step(
                payload={"mode": "upscale", "upscaling_resize": 2},
                inputs=[{"from": "txt2img", "file": "image-0.png", "as": "init.png"}],
            ),
            "txt2img": step(payload={"prompt": "a red fox"}, outputs=["image-0.png"]),
        },
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert [s["name"] for s in body["steps"]] == ["txt2img", "upscale"]  # run order
    assert body["steps"][1]["after"] == ["txt2img"]
    job = ids(body)
    assert await state(served.admin, job["upscale"]) == "waiting"

    first = await agent.next_assignment()
    assert [w.job_id for w in first.jobs] == [job["txt2img"]]
    await agent.start(first)
    await agent.finish(first, {job["txt2img"]: {"image-0.png": PNG, "info.json": b"{}"}})

    second = await agent.next_assignment()
    (work,) = second.jobs
    assert work.job_id == job["upscale"]
    sha = hashlib.sha256(PNG).hexdigest()
    assert [(f.name, f.sha256) for f in work.inputs] == [("init.png", sha)]
    held = served.plane.rt.settings.blob_path() / "inputs" / sha
    assert held.read_bytes() == PNG  # the agent fetches it as it fetches an uploaded input
    assert await served.plane.inputs.may_fetch(second.allocation_id, second.attempt, sha)
    await agent.start(second)
    await agent.finish(second)
    done = await eventually(lambda: _group(served, body["id"], "succeeded"))
    assert done["progress"] == 1.0
    assert done["counts"] == {"succeeded": 2}


async def _group(served: Served, group_id: str, want: str) -> dict[str, Any] | None:
    kind = "pipelines" if group_id.startswith("pipe_") else "arrays"
    body: dict[str, Any] = (await served.admin.get(f"/v1/{kind}/{group_id}")).json()
    return body if body["state"] == want else None


@pytest.mark.parametrize(
    ("steps", "want_field", "want_words"),
    [
        pytest.param(
            {"a": step(after=["b"]), "b": step(after=["a"])},
            "steps.a.after",
            "a cycle: a -> b -> a",
            id="a cycle",
        ),
        pytest.param(
            {"a": step(), "b": step(after_any=["nobody"])},
            "steps.b.after_any[0]",
            "no step 'nobody'",
            id="an unknown step",
        ),
        pytest.param(
            {
                "gen": step(outputs=["image-0.png"]),
                "up": step(inputs=[{"from": "gen", "file": "mask.png"}]),
            },
            "steps.up.inputs[0].file",
            "makes no file 'mask.png'",
            id="a file the step does not make",
        ),
        pytest.param(
            {"a": step(), "b": step(after=["job_0000000000000000000000"])},
            "steps.b.after[0]",
            "no job",
            id="an unknown job id",
        ),
        pytest.param(
            {"a": step(priority="nope")},
            "steps.a.priority",
            "unknown class",
            id="a bad field of one step",
        ),
    ],
)
async def test_a_pipeline_is_refused_whole_naming_the_step_and_field(
    served: Served, steps: dict[str, Any], want_field: str, want_words: str
) -> None:
    refused = await pipeline(served, steps)
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == want_field
    assert want_words in refused.json()["message"]
    listed = await served.admin.get("/v1/jobs")
    assert listed.json()["jobs"] == []  # nothing half-written


async def test_a_failed_step_cancels_those_that_need_it_with_the_reason(served: Served) -> None:
    agent = await served.agent("gpu-1")
    made = await pipeline(
        served,
        {
            "a": step(max_attempts=2),
            "b": step(after=["a"]),
            "c": step(after=["b"]),
            "cleanup": step(after_any=["a"]),
        },
    )
    job = ids(made.json())
    first = await agent.next_assignment()
    await agent.start(first)
    await agent.fail(first, "CUDA out of memory", retryable=True)  # its own retry first
    assert await state(served.admin, job["b"]) == "waiting"
    again = await agent.next_assignment()
    assert [w.job_id for w in again.jobs] == [job["a"]]
    await agent.start(again)
    await agent.fail(again, "CUDA out of memory", retryable=True)  # out of attempts

    b = await until(served.admin, job["b"], "cancelled")
    assert "step 'a'" in b["error"]
    assert "failed" in b["error"]
    assert "CUDA out of memory" in b["error"]
    c = await until(served.admin, job["c"], "cancelled")
    assert "step 'b'" in c["error"]
    last = await agent.next_assignment()  # after_any: it runs whatever became of a
    assert [w.job_id for w in last.jobs] == [job["cleanup"]]
    group = (await served.admin.get(f"/v1/pipelines/{made.json()['id']}")).json()
    assert group["counts"] == {"failed": 1, "cancelled": 2, "placed": 1}


async def test_cancelling_a_pipeline_cancels_every_step(served: Served) -> None:
    agent = await served.agent("gpu-1")
    made = await pipeline(served, {"a": step(), "b": step(after=["a"])})
    job = ids(made.json())
    running = await agent.next_assignment()
    await agent.start(running)
    cancelled = await served.admin.post(f"/v1/pipelines/{made.json()['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["counts"] == {"cancelled": 2}
    stop = await agent.receive()
    assert stop.allocation_id == running.allocation_id  # the running step is told to stop
    assert await state(served.admin, job["b"]) == "cancelled"


async def test_a_job_runs_after_existing_jobs_and_reads_all_their_files(served: Served) -> None:
    agent = await served.agent("gpu-1")
    first = (await served.admin.post("/v1/jobs", json=step())).json()["id"]
    bad = await served.admin.post("/v1/jobs", json=step(after=["job_nope"]))
    assert bad.status_code == 422
    assert bad.json()["field"] == "after[0]"
    second = await served.admin.post("/v1/jobs", json=step(inputs=[{"from": first}]))
    assert second.status_code == 201, second.text
    assert second.json()["state"] == "waiting"
    assert second.json()["after"] == [{"job": first, "need": "ok"}]
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.finish(a, {first: {"a.png": b"one", "b.png": b"two"}})
    b: Assignment = await agent.next_assignment()
    assert sorted(f.name for f in b.jobs[0].inputs) == ["a.png", "b.png"]
    # Reading a file the finished job did not make is refused at once.
    wrong = await served.admin.post(
        "/v1/jobs", json=step(inputs=[{"from": first, "file": "c.png"}])
    )
    assert wrong.status_code == 422
    assert "made no file 'c.png'" in wrong.json()["message"]


async def test_an_array_is_submitted_followed_reprioritised_and_cancelled_as_one(
    served: Served,
) -> None:
    made = await served.admin.post(
        "/v1/arrays",
        json={
            "job": step(payload={"prompt": "a fox"}),
            "count": 20,
            "index_key": "seed",
            "index_start": 1000,
        },
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["size"] == 20
    assert [j["payload"]["seed"] for j in body["jobs"]] == list(range(1000, 1020))
    assert [j["array"]["index"] for j in body["jobs"]] == list(range(20))
    moved = await served.admin.patch(f"/v1/arrays/{body['id']}", json={"priority": "paid"})
    assert {j["priority"] for j in moved.json()["jobs"]} == {"paid"}
    agent: StubAgent = await served.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.progress(a, 0.5)
    await agent.finish(a)
    half = await eventually(lambda: _done_count(served, body["id"]))
    assert half["progress"] == pytest.approx(len(a.jobs) / 20)
    gone = await served.admin.post(f"/v1/arrays/{body['id']}/cancel")
    assert gone.json()["state"] == "cancelled"
    assert gone.json()["counts"]["succeeded"] == len(a.jobs)
    listed = await served.admin.get("/v1/arrays")
    assert [g["id"] for g in listed.json()["items"]] == [body["id"]]
    for j in gone.json()["jobs"]:  # the array goes with its last job
        assert (await served.admin.delete(f"/v1/jobs/{j['id']}")).status_code == 204
    assert (await served.admin.get(f"/v1/arrays/{body['id']}")).status_code == 404


async def _done_count(served: Served, group_id: str) -> dict[str, Any] | None:
    body: dict[str, Any] = (await served.admin.get(f"/v1/arrays/{group_id}")).json()
    return body if body["counts"].get("succeeded") else None


async def test_a_command_array_element_has_its_index_in_its_environment(served: Served) -> None:
    made = await served.admin.post(
        "/v1/arrays",
        json={"job": {"backend": "command", "payload": {"argv": ["true"]}}, "count": 2},
    )
    envs = [j["payload"]["env"]["CORRAL_ARRAY_INDEX"] for j in made.json()["jobs"]]
    assert envs == ["0", "1"]
    assert [j["payload"]["array_index"] for j in made.json()["jobs"]] == [0, 1]


LATENT = bytes(range(256)) * 8192  # 2 MiB: over the agent's inline limit, kept where made


@pytest.mark.parametrize(
    ("move_bytes_per_s", "want_node"),
    [
        pytest.param(1000.0, "gpu-1", id="a costly move waits for the machine that made it"),
        pytest.param(1e15, "gpu-2", id="a cheap move goes to a free machine at once"),
    ],
)
async def test_a_step_is_held_near_its_inputs_while_moving_them_costs_more(
    db_url: str, tmp_path: Path, move_bytes_per_s: float, want_node: str
) -> None:
    sections = {"scheduling": {"input_move_bytes_per_s": move_bytes_per_s}}
    async with serve(db_url, tmp_path, sections=sections) as served:
        maker = await served.agent("gpu-1")
        made = await pipeline(
            served,
            {
                "encode": step(resources={"gpus": 1}),
                "decode": step(resources={"gpus": 1}, inputs=[{"from": "encode"}]),
            },
        )
        job = ids(made.json())
        first = await maker.next_assignment()
        blocker = step(
            resources={"gpus": 1}, priority="paid", node_selector={"corral/node": "gpu-1"}
        )
        other = (await served.admin.post("/v1/jobs", json=blocker)).json()["id"]
        await eventually(lambda: _waits(served, other))
        free = await served.agent("gpu-2")
        await maker.start(first)
        await maker.finish(first, {job["encode"]: {"latent.bin": LATENT}})
        busy = await maker.next_assignment()  # the paid job takes the machine first
        assert [w.job_id for w in busy.jobs] == [other]
        if want_node == "gpu-1":
            held = await eventually(lambda: _waits(served, job["decode"]))
            assert held["node_selector"] == {"corral/node": "gpu-1"}
            assert free.pending() == []  # gpu-2 is free, and not used
            await maker.start(busy)
            await maker.finish(busy)
        runner = maker if want_node == "gpu-1" else free
        last = await runner.next_assignment()
        assert [w.job_id for w in last.jobs] == [job["decode"]]


async def _waits(served: Served, job_id: str) -> dict[str, Any] | None:
    """The job once the scheduler has looked at it and left it queued (it says why)."""
    body: dict[str, Any] = (await served.admin.get(f"/v1/jobs/{job_id}")).json()
    return body if body["state"] == "queued" and body["queue"] else None


async def test_an_idempotency_key_returns_the_same_pipeline_and_array(served: Served) -> None:
    key = {"Idempotency-Key": "nightly-1"}
    steps = {"a": step(), "b": step(after=["a"])}
    first = await served.admin.post("/v1/pipelines", json={"steps": steps}, headers=key)
    again = await served.admin.post("/v1/pipelines", json={"steps": steps}, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = {"a": step(priority="paid"), "b": step(after=["a"])}
    clash = await served.admin.post("/v1/pipelines", json={"steps": other}, headers=key)
    assert clash.status_code == 409
    array = {"job": step(), "count": 3}
    made = await served.admin.post("/v1/arrays", json=array, headers={"Idempotency-Key": "k2"})
    same = await served.admin.post("/v1/arrays", json=array, headers={"Idempotency-Key": "k2"})
    assert (made.status_code, same.status_code) == (201, 200)
    assert same.json()["id"] == made.json()["id"]
    assert len((await served.admin.get("/v1/jobs")).json()["jobs"]) == 5


async def test_a_team_sees_and_touches_only_its_own_pipelines_and_arrays(served: Served) -> None:
    async def team(name: str) -> httpx.AsyncClient:
        body = {"kind": "team", "name": name, "team": name}
        made = await served.admin.post("/v1/tokens", json=body)
        return served.client(made.json()["token"])

    red, blue = await team("red"), await team("blue")
    async with red, blue:
        ours = await red.post("/v1/pipelines", json={"steps": {"a": step()}})
        assert ours.status_code == 201
        assert ours.json()["team"] == "red"
        pipe, job = ours.json()["id"], ours.json()["steps"][0]["job_id"]
        arr = (await red.post("/v1/arrays", json={"job": step(), "count": 2})).json()["id"]
        for path in (f"/v1/pipelines/{pipe}", f"/v1/arrays/{arr}"):
            assert (await blue.get(path)).status_code == 404
            assert (await blue.post(f"{path}/cancel")).status_code == 404
            assert (await blue.patch(path, json={"priority": "paid"})).status_code == 404
        assert (await blue.get("/v1/pipelines")).json()["items"] == []
        assert [g["id"] for g in (await red.get("/v1/arrays")).json()["items"]] == [arr]
        theirs = await blue.post("/v1/pipelines", json={"steps": {"b": step(after=[job])}})
        assert theirs.status_code == 422
        assert theirs.json()["field"] == "steps.b.after[0]"
        forged = await blue.post("/v1/pipelines", json={"team": "red", "steps": {"b": step()}})
        assert forged.status_code == 403
        assert (await red.get(f"/v1/pipelines/{pipe}")).json()["state"] == "running"
