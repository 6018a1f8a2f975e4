"""The retention sweep (loops/retention.py) and the previews a running job keeps.

* a finished job's previews, with its progress and preview events, go ``previews_s`` after it
  ended; the job, its other events and its results stay;
* a finished job goes ``finished_jobs_s`` after it ended, with its events, its allocations,
  its result files and previews; queued and running jobs stay however old they are;
* batches: every expired job goes whatever the batch size, a recent one between them stays;
* a preview folder of no job is deleted; only the leader sweeps;
* a running job keeps its latest ``previews_per_job`` previews;
* a real server process runs the sweep on its own;
* ``DELETE /v1/jobs/{id}`` does the same to one finished job at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from process_harness import ServerProcess
from server_harness import ADMIN, World

from corral.core.errors import Conflict, NotFound
from corral.core.states import JobState
from corral.server.agentlink.base import Assignment
from corral.server.agentlink.inprocess import StubAgent
from corral.server.loops.retention import RetentionLoop
from corral.server.store.tables import allocations

HOUR, DAY = 3600.0, 86400.0
BIG = b"r" * 20_000  # larger than a job row holds: a result file in the blob store


async def _run(world: World, agent: StubAgent) -> tuple[str, Assignment]:
    job = await world.submit(resources={"gpus": 1})
    await world.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    return job.job.id, a


def _files(world: World, folder: str) -> list[str]:
    root = world.plane.rt.settings.blob_path() / folder
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


async def _allocation_ids(world: World) -> set[str]:
    async with world.plane.rt.db.read() as conn:
        return {r[0] for r in await conn.execute(sa.select(allocations.c.id))}


@pytest.mark.anyio
async def test_previews_go_an_hour_after_the_end_and_the_job_a_month_after(world: World) -> None:
    agent = await world.agent("n1")
    job_id, a = await _run(world, agent)
    await agent.progress(a, 0.5, "half way")
    await agent.preview(a, job_id, b"png-1")
    await agent.preview(a, job_id, b"png-2")
    await agent.finish(a, {job_id: {"out.bin": BIG}})
    waiting = await world.submit(resources={"gpus": 4})  # never fits: queued for good
    assert len(_files(world, f"previews/{job_id}")) == 2
    assert _files(world, f"results/{job_id}") == ["out.bin"]

    world.clock.advance(HOUR - 1)
    assert not await world.plane.retention.sweep(), "an hour has not passed since it ended"

    world.clock.advance(2)
    report = await world.plane.retention.sweep()
    assert (report.previews, report.events, report.jobs) == (2, 3, 0)
    assert _files(world, f"previews/{job_id}") == []
    kinds = await world.kinds(job_id)
    assert "job.preview" not in kinds
    assert "job.progress" not in kinds
    assert kinds[-1] == "job.succeeded"
    job = await world.job(job_id)
    assert job.state is JobState.SUCCEEDED
    _, data = await world.plane.jobs.result_file(ADMIN, job_id, "out.bin")
    assert data == BIG, "results stay as long as the job"

    assert [e.kind.value for e in await world.events() if e.job_id is None] == ["node.joined"]
    world.clock.advance(30 * DAY - HOUR)
    report = await world.plane.retention.sweep()
    assert (report.jobs, report.results) == (1, 1)
    assert [e for e in await world.events() if e.job_id is None] == [], "node events age too"
    with pytest.raises(NotFound):
        await world.job(job_id)
    assert await world.events(job_id) == []
    assert a.allocation_id not in await _allocation_ids(world)
    assert _files(world, f"results/{job_id}") == []
    assert (await world.job(waiting.job.id)).state is JobState.QUEUED, "queued work is kept"
    assert await world.kinds(waiting.job.id) == ["job.submitted"]
    deleted = world.plane.rt.metrics.retention_deleted
    assert deleted.labels("jobs")._value.get() == 1
    assert deleted.labels("previews")._value.get() == 2


@pytest.mark.anyio
async def test_running_and_recent_jobs_stay_and_batches_reach_every_expired_job(
    world: World,
) -> None:
    world.plane.rt.settings.retention.batch = 2
    agent = await world.agent("n1", gpus=2)
    old = []
    for _ in range(5):
        job_id, a = await _run(world, agent)
        await agent.finish(a)
        old.append(job_id)
    running, _ = await _run(world, agent)  # submitted as long ago, still running
    world.clock.advance(31 * DAY)
    recent, a = await _run(world, agent)
    await agent.finish(a)
    world.clock.advance(1)
    report = await world.plane.retention.sweep()
    assert report.jobs == 5
    for job_id in old:
        with pytest.raises(NotFound):
            await world.job(job_id)
    assert (await world.job(running)).state is JobState.RUNNING
    assert (await world.job(recent)).state is JobState.SUCCEEDED
    assert not await world.plane.retention.sweep(), "nothing left to delete"


@pytest.mark.anyio
async def test_a_preview_folder_of_no_job_goes_and_only_the_leader_sweeps(world: World) -> None:
    blobs = world.plane.rt.blobs
    await blobs.put("previews/j_gone/0-aa.png", b"orphan")
    assert not await RetentionLoop(world.plane.rt, leading=lambda: False).sweep()
    assert _files(world, "previews/j_gone") == ["0-aa.png"]
    report = await world.plane.retention.sweep()
    assert report.previews == 1
    assert not (world.plane.rt.settings.blob_path() / "previews" / "j_gone").exists()


@pytest.mark.anyio
async def test_retention_off_keeps_everything(world: World) -> None:
    world.plane.rt.settings.retention.finished_jobs_s = 0
    world.plane.rt.settings.retention.previews_s = 0
    agent = await world.agent("n1")
    job_id, a = await _run(world, agent)
    await agent.preview(a, job_id, b"png")
    await agent.finish(a)
    world.clock.advance(365 * DAY)
    assert not await world.plane.retention.sweep()
    assert (await world.job(job_id)).state is JobState.SUCCEEDED
    assert len(_files(world, f"previews/{job_id}")) == 1


@pytest.mark.anyio
async def test_a_running_job_keeps_its_latest_previews(world: World) -> None:
    world.plane.rt.settings.retention.previews_per_job = 3
    agent = await world.agent("n1")
    job_id, a = await _run(world, agent)
    for i in range(6):
        await agent.preview(a, job_id, f"png-{i}".encode())
    blobs = world.plane.rt.blobs
    kept = await blobs.keys(f"previews/{job_id}")
    assert len(kept) == 3
    assert [await blobs.get(k) for k in kept] == [b"png-3", b"png-4", b"png-5"]
    urls = [e.data["url"] for e in await world.events(job_id) if e.kind.value == "job.preview"]
    latest = urls[-1].rsplit("/", 1)[1]
    assert await world.plane.jobs.preview(ADMIN, job_id, latest) == b"png-5"
    with pytest.raises(NotFound):  # the oldest is gone: its URL answers 404
        await world.plane.jobs.preview(ADMIN, job_id, urls[0].rsplit("/", 1)[1])


def test_a_server_process_sweeps_on_its_own(db_url: str, tmp_path: Path) -> None:
    env = {"CORRAL_RETENTION__FINISHED_JOBS_S": "0.5", "CORRAL_RETENTION__SWEEP_S": "0.2"}
    server = ServerProcess(db_url, tmp_path, env=env).start()
    try:
        headers = {"Authorization": f"Bearer {server.admin_token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=10) as c:
            kept = c.post("/v1/jobs", json={"kind": "sample"}).json()["id"]  # queued: stays
            gone = c.post("/v1/jobs", json={"kind": "sample"}).json()["id"]
            assert c.post(f"/v1/jobs/{gone}/cancel").json()["state"] == "cancelled"
            deadline = time.monotonic() + 20
            while c.get(f"/v1/jobs/{gone}").status_code == 200:
                assert time.monotonic() < deadline, "the cancelled job was never swept"
                time.sleep(0.1)
            missing = c.get(f"/v1/jobs/{gone}")
            assert missing.status_code == 404
            assert gone in missing.text
            assert c.get(f"/v1/jobs/{kept}").json()["state"] == "queued"
            # counted once the sweep's transaction is done, a moment after the row is gone
            counted = 'corral_retention_deleted_total{what="jobs"} 1.0'
            while counted not in c.get("/metrics").text:
                assert time.monotonic() < deadline, "the sweep was never counted"
                time.sleep(0.1)
    finally:
        server.stop()
    assert not [line for line in server.output if "sweep failed" in line], server.output


@pytest.mark.anyio
async def test_a_finished_job_can_be_deleted_at_once_and_a_running_one_cannot(
    world: World,
) -> None:
    agent = await world.agent("n1")
    job_id, a = await _run(world, agent)
    await agent.preview(a, job_id, b"png")
    with pytest.raises(Conflict, match="cancel it first"):
        await world.plane.jobs.delete(ADMIN, job_id)
    await agent.finish(a, {job_id: {"out.bin": BIG}})
    await world.plane.jobs.delete(ADMIN, job_id)
    with pytest.raises(NotFound):
        await world.job(job_id)
    assert await world.events(job_id) == []
    assert _files(world, f"results/{job_id}") == []
    assert _files(world, f"previews/{job_id}") == []
    assert a.allocation_id not in await _allocation_ids(world)
    with pytest.raises(NotFound):
        await world.plane.jobs.delete(ADMIN, job_id)
