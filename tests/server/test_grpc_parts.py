"""The gRPC link's server-side pure parts: translation, checkpoint refs, chunked uploads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from corral.core import VirtualClock
from corral.core.model import JobKind
from corral.core.states import StopReason
from corral.proto.bundles import unpack_server
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.server.agentlink.base import Assignment, HelloReply, JobWork, Standing, StopOrder
from corral.server.agentlink.grpc_convert import (
    ack_message,
    assign_message,
    checkpoint_ref,
    gpus_from,
    inventory_from,
    split_ref,
    welcome_messages,
)
from corral.server.agentlink.grpc_link import Session
from corral.server.agentlink.grpc_service import bearer
from corral.server.agentlink.grpc_uploads import Uploader, UploadError, Uploads
from corral.server.blobs import LocalBlobStore


@pytest.mark.parametrize(
    ("path", "step", "ref"),
    [("/ck/a.pt", 120, "/ck/a.pt#step=120"), ("/ck/a.pt", 0, "/ck/a.pt"), ("", 0, "")],
)
def test_checkpoint_refs_round_trip(path: str, step: int, ref: str) -> None:
    assert checkpoint_ref(path, step) == ref
    assert split_ref(ref) == (path, step)


def test_a_batched_assignment_lists_every_job_and_resumes_from_its_checkpoint() -> None:
    jobs = (
        JobWork("j1", JobKind.SAMPLE, {"prompt": "a"}, model="sdxl", checkpoint="/ck#step=7"),
        JobWork("j2", JobKind.SAMPLE, {"prompt": "b"}, timeout_s=30),
    )
    msg = assign_message(Assignment("al-1", 2, "n1", jobs, gpu_indices=(0,), vram_bytes=99))
    a = msg.assign
    assert [(w.job_id, w.resume_from, w.resume_step, w.model) for w in a.jobs] == [
        ("j1", "/ck", 7, "sdxl"),
        ("j2", "", 0, ""),
    ]
    assert [json.loads(w.payload_json) for w in a.jobs] == [{"prompt": "a"}, {"prompt": "b"}]
    assert (a.attempt, list(a.gpu_indices), a.vram_bytes) == (2, [0], 99)


def test_cpus_cross_the_wire_to_a_milli_cpu_and_old_peers_read_whole_ones() -> None:
    msg = assign_message(Assignment("al-1", 1, "n1", (), cpus=0.5)).assign
    assert (msg.cpu_milli, msg.cpus) == (500, 1)  # an agent from before reads a whole CPU
    assert inventory_from(pb.Inventory(node="n", cpus=1, cpu_milli=1500)).cpus == 1.5
    assert inventory_from(pb.Inventory(node="old", cpus=8)).cpus == 8  # no cpu_milli sent


def numa(*pairs: tuple[int, int]) -> pb.Inventory:
    return pb.Inventory(
        node="n",
        cpu_milli=8000,
        numa_cpus=[pb.NumaCpus(numa_node=n, cpu_milli=m) for n, m in pairs],
    )


@pytest.mark.parametrize(
    ("report", "want"),
    [
        (((1, 5500), (0, 2500)), ((0, 2.5), (1, 5.5))),  # sorted by node, in CPU slots
        ((), ()),  # an agent without a topology, or from before NUMA reports: one pool
        (((0, 4000), (0, 4000)), ()),  # a node named twice: not plausible, one pool
        (((0, -1000), (1, 9000)), ()),
        (tuple((n, 1) for n in range(65)), ()),  # more NUMA nodes than any machine has
    ],
)
def test_the_hello_s_cpus_per_numa_node_are_kept_when_plausible(
    report: tuple[tuple[int, int], ...], want: tuple[tuple[int, float], ...]
) -> None:
    assert inventory_from(numa(*report)).numa_cpus == want


def test_the_welcome_comes_first_then_work_then_stops_then_intake() -> None:
    reply = HelloReply(
        assign=(Assignment("al-1", 1, "n1", (JobWork("j", JobKind.CUSTOM),)),),
        stop=(StopOrder("al-0", StopReason.CANCEL),),
        intake_open=False,
        heartbeat_s=2.0,
    )
    msgs = welcome_messages("n1", reply)
    assert [m.WhichOneof("body") for m in msgs] == ["welcome", "assign", "stop", "intake"]
    assert msgs[0].welcome.heartbeat_interval_s == 2.0
    assert msgs[-1].intake.paused


def test_bearer_tokens_from_metadata() -> None:
    assert bearer([("authorization", "Bearer abc")]) == "abc"
    assert bearer([("Authorization", "bearer  abc ")]) == "abc"
    assert bearer([("authorization", "Basic abc")]) is None
    assert bearer(None) is None


DATA = bytes(range(256)) * 40  # 10 KiB
SHA = hashlib.sha256(DATA).hexdigest()


def chunks(start: int = 0, stop: int | None = None, *, sha: str = SHA, alloc: str = "al_1",
           size: int = 1000, probe: bool = False) -> list[pb.BlobChunk]:  # fmt: skip
    base = {"allocation_id": alloc, "attempt": 1, "name": "j1/out.bin", "sha256": sha}
    if probe:
        return [pb.BlobChunk(**base)]
    end = len(DATA) if stop is None else stop
    return [
        pb.BlobChunk(
            **base, offset=o, data=DATA[o : min(o + size, end)], last=o + size >= len(DATA)
        )
        for o in range(start, end, size)
    ]


async def stream(items: Iterable[pb.BlobChunk]) -> AsyncIterator[pb.BlobChunk]:
    for item in items:
        yield item


async def _live(allocation_id: str, attempt: int) -> Standing:
    return Standing.LIVE


N1 = Uploader("n1", _live)  # every allocation is n1's, and running


def uploads(tmp_path: Path, max_bytes: int = 1 << 20) -> Uploads:
    return Uploads(LocalBlobStore(tmp_path), VirtualClock(), max_bytes=max_bytes, idle_s=60)


def test_an_upload_resumes_overlaps_harmlessly_and_a_retry_is_the_same_blob(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = uploads(tmp_path)
        half = await up.receive(stream(chunks(stop=4000)), N1)
        assert (half.blob_id, half.received) == ("", 4000)
        assert (await up.receive(stream(chunks(probe=True)), N1)).received == 4000
        done = await up.receive(stream(chunks(start=3000)), N1)  # overlaps what arrived
        assert done.blob_id == f"uploads/al_1/1/{SHA}"
        stored = up.stored_for("al_1", 1, done.blob_id)
        assert (stored.size, stored.sha256) == (len(DATA), SHA)
        assert await LocalBlobStore(tmp_path).get(done.blob_id) == DATA
        assert (await up.receive(stream(chunks(probe=True)), N1)).blob_id == done.blob_id
        assert (await up.receive(stream(chunks()), N1)).blob_id == done.blob_id

    asyncio.run(scenario())


def test_a_deleted_upload_leaves_no_empty_folders_and_the_same_bytes_are_stored_again(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        up, store = uploads(tmp_path), LocalBlobStore(tmp_path)
        done = await up.receive(stream(chunks()), N1)
        assert await store.delete(done.blob_id)  # a replaced checkpoint (services/checkpoints)
        assert not await store.delete(done.blob_id), "already gone"
        assert not (tmp_path / "uploads").exists(), "its empty folders went with it"
        again = await up.receive(stream(chunks()), N1)
        assert again.blob_id == done.blob_id
        assert await store.get(again.blob_id) == DATA

    asyncio.run(scenario())


def test_an_upload_is_assembled_on_disk_and_leaves_no_scratch_behind(tmp_path: Path) -> None:
    scratch = tmp_path / ".partial"

    async def scenario() -> None:
        up = uploads(tmp_path)
        await up.receive(stream(chunks(stop=4000)), N1)
        files = list(scratch.iterdir())
        assert [f.stat().st_size for f in files] == [4000], "the bytes so far, on disk"
        done = await up.receive(stream(chunks(start=4000)), N1)
        assert list(scratch.iterdir()) == [], "moved into place"
        assert (tmp_path / done.blob_id).read_bytes() == DATA
        again = await up.receive(stream(chunks()), N1)  # the same bytes: stored once
        assert again.blob_id == done.blob_id
        assert list(scratch.iterdir()) == []

    asyncio.run(scenario())


def test_refused_and_abandoned_uploads_delete_their_scratch_files(tmp_path: Path) -> None:
    scratch = tmp_path / ".partial"

    async def scenario() -> None:
        clock = VirtualClock()
        up = Uploads(LocalBlobStore(tmp_path), clock, max_bytes=5000, idle_s=60)
        with pytest.raises(UploadError):
            await up.receive(stream(chunks()), N1)  # 10 KiB against a 5,000-byte limit
        assert list(scratch.iterdir()) == []
        await up.receive(stream(chunks(stop=4000, sha="0" * 64)), N1)
        with pytest.raises(UploadError):  # too big on the way
            await up.receive(stream(chunks(start=4000, sha="0" * 64)), N1)
        await up.receive(stream(chunks(stop=2000, alloc="al_2")), N1)
        assert len(list(scratch.iterdir())) == 1
        clock.advance(61)
        await up.receive(stream(chunks(probe=True, alloc="al_3")), N1)  # any call sweeps
        assert list(scratch.iterdir()) == [], "abandoned; and a probe starts no file"
        await up.receive(stream(chunks(stop=2000, alloc="al_4")), N1)
        up.close()  # the server stops
        assert list(scratch.iterdir()) == []

    asyncio.run(scenario())


def test_a_restart_deletes_scratch_files_no_upload_writes_any_more(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    old, fresh = store.scratch("al_1-1-old"), store.scratch("al_1-1-fresh")
    old.write_bytes(b"cut off")
    fresh.write_bytes(b"a replica is writing this")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    Uploads(store, VirtualClock(), max_bytes=1 << 20, idle_s=600)
    assert (old.exists(), fresh.exists()) == (False, True)


def test_a_fetch_streams_the_file_from_an_offset(tmp_path: Path) -> None:
    async def scenario() -> list[pb.BlobChunk]:
        up = uploads(tmp_path)
        done = await up.receive(stream(chunks()), N1)
        request = pb.BlobRequest(allocation_id="al_9", attempt=2, blob_id=done.blob_id, offset=3000)
        return list(up.chunks(request, 4096))

    got = asyncio.run(scenario())
    assert [c.offset for c in got] == [3000, 7096]
    assert b"".join(c.data for c in got) == DATA[3000:]
    assert [c.last for c in got] == [False, True]
    assert {c.sha256 for c in got} == {SHA}
    with pytest.raises(UploadError) as caught:
        list(uploads(tmp_path).chunks(pb.BlobRequest(blob_id=f"uploads/al_1/1/{'0' * 64}"), 10))
    assert caught.value.code == "NOT_FOUND"


@pytest.mark.parametrize(
    ("case", "want_code"),
    [
        pytest.param("bad-checksum", "DATA_LOSS", id="bad-checksum"),
        pytest.param("too-big", "RESOURCE_EXHAUSTED", id="too-big"),
        pytest.param("not-its-blob", "PERMISSION_DENIED", id="not-its-blob"),
        pytest.param("bad-id", "INVALID_ARGUMENT", id="bad-allocation-id"),
    ],
)
def test_refused_uploads_say_why(tmp_path: Path, case: str, want_code: str) -> None:
    async def scenario() -> None:
        up = uploads(tmp_path, max_bytes=5000 if case == "too-big" else 1 << 20)
        if case == "not-its-blob":
            done = await up.receive(stream(chunks()), N1)
            up.stored_for("al_2", 1, done.blob_id)
        sha = "0" * 64 if case == "bad-checksum" else SHA
        alloc = "../etc" if case == "bad-id" else "al_1"
        await up.receive(stream(chunks(sha=sha, alloc=alloc)), N1)

    with pytest.raises(UploadError) as caught:
        asyncio.run(scenario())
    assert caught.value.code == want_code


def test_a_session_writes_what_is_queued_as_one_bundle_to_an_agent_that_reads_them() -> None:
    async def written(bundling: bool) -> list[list[str]]:
        session = Session("n1")
        session.bundles = bundling
        session.welcome([])
        for i in range(3):
            session.send(ack_message(i, f"a{i}", "accepted"))
        session.end()
        out = [msg async for msg in session.messages()]
        return [[m.ack.allocation_id for m in unpack_server(msg)] for msg in out]

    assert asyncio.run(written(True)) == [["a0", "a1", "a2"]]
    assert asyncio.run(written(False)) == [["a0"], ["a1"], ["a2"]], "an older agent: one by one"


def test_gpu_figures_cross_the_wire_and_an_unmeasured_temperature_stays_unknown() -> None:
    from corral.agent import wire
    from corral.agent.fingerprint import GpuSnapshot, GpuStatus

    snap = GpuSnapshot((GpuStatus(0, "RTX 4090", 24, 20, 0.5, 66.0), GpuStatus(1, "L4", 24, 24)))
    sent = pb.Heartbeat.FromString(wire.heartbeat(snap, {}, 0.0).SerializeToString())
    hot, unknown = gpus_from(sent.gpus)
    assert (hot.utilization, hot.temperature_c, hot.vram_free_bytes) == (0.5, 66.0, 20)
    assert unknown.temperature_c is None
