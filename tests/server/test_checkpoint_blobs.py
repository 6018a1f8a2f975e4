"""Uploaded checkpoints are deleted once no attempt can resume from them (services/checkpoints.py).

* a checkpoint replaced by a newer one is deleted; the newer one stays;
* a requeued job keeps its latest one (its next attempt resumes from it), and it goes when
  the job ends: succeeded, failed for good, cancelled;
* a checkpoint on shared storage, or a blob not named as the upload service names them, is
  never touched;
* a result's upload goes once the server took the result, unless it is also a checkpoint
  a job still resumes from;
* an uploaded result is linked under ``results/``, never read into memory or copied, and
  stays when its upload goes.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
from server_harness import ADMIN, World

from corral.core.errors import NotFound
from corral.core.states import JobState
from corral.server.agentlink.base import Assignment, ResultBlob
from corral.server.agentlink.inprocess import StubAgent
from corral.server.blobs import LocalBlobStore, StoredBlob
from corral.server.services.checkpoints import uploaded

pytestmark = pytest.mark.anyio


async def _upload(world: World, a: Assignment, name: str) -> str:
    """Store a checkpoint as the upload service would; its ``blob:`` reference."""
    key = f"uploads/{a.allocation_id}/{a.attempt}/{name}"
    await world.plane.rt.blobs.put(key, b"weights " + name.encode())
    return f"blob:{key}"


def _stored(world: World, ref: str) -> bool:
    return world.plane.rt.blobs.path(ref.removeprefix("blob:")) is not None


async def _running(world: World, name: str = "n1", **spec: object) -> tuple[StubAgent, Assignment]:
    job = await world.submit(resources={"gpus": 1}, kind="train", **spec)
    agent = await world.agent(name)
    await world.cycle()
    a = await agent.next_assignment()
    assert a.jobs[0].job_id == job.job.id
    await agent.start(a)
    return agent, a


async def test_a_replaced_checkpoint_is_deleted_and_the_latest_kept(world: World) -> None:
    agent, a = await _running(world)
    first, second = await _upload(world, a, "aa"), await _upload(world, a, "bb")
    await agent.checkpoint(a, first, step=10)
    assert _stored(world, first)
    await agent.checkpoint(a, second, step=20)
    assert not _stored(world, first), "no attempt can resume from it any more"
    assert _stored(world, second)
    await agent.checkpoint(a, second, step=20)  # reported twice: still the one to keep
    assert _stored(world, second)
    await agent.checkpoint(a, "/shared/ck/30", step=30)  # shared storage: the user's
    assert not _stored(world, second)
    job = await world.job(a.jobs[0].job_id)
    assert (job.checkpoint, job.checkpoint_step) == ("/shared/ck/30", 30)


async def test_the_latest_checkpoint_stays_through_a_retry_and_goes_when_the_job_ends(
    world: World,
) -> None:
    agent, a = await _running(world, max_attempts=3)
    ref = await _upload(world, a, "cc")
    await agent.checkpoint(a, ref, step=40)
    await agent.fail(a, "CUDA error: unspecified launch failure")
    job = await world.job(a.jobs[0].job_id)
    assert job.state is JobState.QUEUED
    assert _stored(world, ref), "the next attempt resumes from it"

    world.clock.advance(600)  # past the backoff
    await agent.heartbeat()
    await world.cycle()
    retry = await agent.next_assignment()
    assert retry.jobs[0].checkpoint == ref
    await agent.start(retry)
    await agent.finish(retry)
    assert (await world.job(job.job.id)).state is JobState.SUCCEEDED
    assert not _stored(world, ref)
    assert (await world.job(job.job.id)).checkpoint == ref, "kept in the job as history"


async def test_a_job_failing_for_good_or_cancelled_leaves_no_checkpoint(world: World) -> None:
    agent, a = await _running(world, max_attempts=1)
    ref = await _upload(world, a, "dd")
    await agent.checkpoint(a, ref, step=5)
    await agent.fail(a, "disk full")
    assert (await world.job(a.jobs[0].job_id)).state is JobState.FAILED
    assert not _stored(world, ref)

    await world.plane.nodes.pause(ADMIN, "n1")  # the next job runs on n2
    agent2, b = await _running(world, "n2")
    ref2 = await _upload(world, b, "ee")
    await agent2.checkpoint(b, ref2, step=5)
    agent2.disconnect()
    await world.tick(after=31)  # the node is lost: the job requeues with its checkpoint
    assert (await world.job(b.jobs[0].job_id)).state is JobState.QUEUED
    assert _stored(world, ref2)
    await world.plane.jobs.cancel(ADMIN, b.jobs[0].job_id)
    assert not _stored(world, ref2)


def test_only_the_upload_services_blobs_are_ever_deleted() -> None:
    assert uploaded("blob:uploads/al_1/2/abc") == ("uploads/al_1/2/abc", "al_1")
    for ref in (
        None,
        "/shared/ck/1",
        "s3://bucket/ck",
        "blob:results/j/1/out.png",
        "blob:uploads/al_1/abc",
        "blob:uploads//2/abc",
    ):
        assert uploaded(ref) is None, ref


async def test_a_results_upload_goes_once_taken_unless_a_job_resumes_from_it(
    world: World,
) -> None:
    agent, a = await _running(world)
    result, checkpoint = await _upload(world, a, "ff"), await _upload(world, a, "gg")
    await agent.checkpoint(a, checkpoint, step=1)
    other = await _upload(world, a, "hh")
    foreign = f"uploads/al_else/1/{'0' * 64}"
    await world.plane.rt.blobs.put(foreign, b"another allocation's")
    keys = [r.removeprefix("blob:") for r in (result, checkpoint, other)]
    await world.plane.agents.uploads_read(a.allocation_id, [*keys, foreign])
    assert not _stored(world, result)
    assert _stored(world, checkpoint), "the running job resumes from it if requeued"
    assert not _stored(world, other)
    assert world.plane.rt.blobs.path(foreign) is not None, "not this allocation's to drop"


@pytest.mark.parametrize("together", [False, True], ids=["finished", "started-and-finished"])
async def test_an_uploaded_result_is_linked_not_read_and_outlives_its_upload(
    world: World, together: bool
) -> None:
    job = await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    await world.cycle()
    a = await agent.next_assignment()
    if not together:
        await agent.start(a)
    data = b"weights " * 50_000
    key = f"uploads/{a.allocation_id}/{a.attempt}/{hashlib.sha256(data).hexdigest()}"
    upload = await world.plane.rt.blobs.put(key, data)
    blob = ResultBlob(job.job.id, "model.bin", b"", "application/octet-stream", upload)
    inbound = world.plane.agents
    if together:
        acks = await inbound.ran("n1", a.allocation_id, a.attempt, [blob])
        assert [ack.value for ack in acks] == ["accepted", "accepted"]
    else:
        assert (
            await inbound.finished("n1", a.allocation_id, a.attempt, [blob])
        ).value == "accepted"
    [f] = (await world.job(job.job.id)).result
    assert (f.size, f.sha256, f.inline) == (len(data), upload.sha256, None)
    blobs = world.plane.rt.blobs
    linked, source = blobs.path(f.key), blobs.path(key)
    assert linked is not None
    assert source is not None
    assert linked.stat().st_ino == source.stat().st_ino, "one file, two names: no copy"
    await inbound.uploads_read(a.allocation_id, [key])
    assert blobs.path(key) is None
    _, got = await world.plane.jobs.result_file(ADMIN, job.job.id, "model.bin")
    assert got == data


async def test_a_blob_is_copied_where_it_cannot_be_linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalBlobStore(tmp_path)
    source = await store.put("uploads/al_1/1/abc", b"bytes" * 1000)

    def cross_device(*_: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    copied = await store.link(source, "results/j1/1/out.bin")
    assert (copied.size, copied.sha256) == (source.size, source.sha256)
    assert await store.get(copied.key) == b"bytes" * 1000
    a, b = store.path(source.key), store.path(copied.key)
    assert a is not None
    assert b is not None
    assert a.stat().st_ino != b.stat().st_ino, "a copy, not a link"
    assert [p.name for p in b.parent.iterdir()] == ["out.bin"], "no temp file left"
    with pytest.raises(NotFound):
        await store.link(StoredBlob("uploads/al_1/1/gone", 1, "x"), "results/j1/1/gone")
