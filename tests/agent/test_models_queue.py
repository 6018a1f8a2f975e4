"""The download queue: a job's model overtakes prefetches, progress per job, two agents."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_fixtures import KIB, FileServer, agent, blob, file_server, reached, spec_for

from corral.agent.models import CacheFull, DownloadProgress, DownloadState, ModelSpec, fetch

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SIZE = 200 * KIB
DATA = {name: blob(SIZE, seed) for seed, name in enumerate(["p1", "p2", "p3", "job", "x"])}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> Iterator[FileServer]:
    with file_server() as s:
        yield s


def serve(server: FileServer, name: str, **behaviour: object) -> ModelSpec:
    return spec_for(name, DATA[name], server.add(name, DATA[name], **behaviour))


def finish_order(futures: dict[str, asyncio.Future[Path]]) -> list[str]:
    order: list[str] = []
    for name, future in futures.items():
        future.add_done_callback(functools.partial(_append, order, name))
    return order


def _append(order: list[str], name: str, _future: object) -> None:
    order.append(name)


async def test_a_job_download_overtakes_queued_and_running_prefetches(
    server: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rehashed: list[Path] = []
    monkeypatch.setattr(fetch, "hash_prefix", lambda path, limit=None: rehashed.append(path))
    p1 = serve(server, "p1", hold_at=64 * KIB)  # a slow transfer that is under way
    p2, p3, job = serve(server, "p2"), serve(server, "p3"), serve(server, "job")
    async with agent(tmp_path, parallel=1) as models:
        downloader = models.downloader
        futures = {s.name: downloader.prefetch(s) for s in (p1, p2, p3)}
        order = finish_order(futures)
        await server.arrived("p1", 2)  # its second chunk is stalled
        path = await downloader.ensure(job, job_id="job-1")  # while p1 is mid-transfer
        assert order == []  # the job's model came first; no prefetch finished
        server.release("p1")
        await asyncio.gather(*futures.values())
        assert order == ["p1", "p2", "p3"]
        assert path.read_bytes() == DATA["job"]
        edges = [(t.current, t.target) for t in downloader.history("p1")]
    assert ("fetching", "queued") in edges  # paused, not restarted:
    assert rehashed == []  # and its digest so far was kept, not recomputed from the file
    assert [h.range for h in server.hits("p1")] == [
        "bytes=0-65535",
        "bytes=65536-131071",  # stalled, then dropped when paused
        "bytes=65536-131071",  # resumed after the job's model
        "bytes=131072-196607",
        f"bytes=196608-{SIZE - 1}",
    ]


async def test_without_preemption_a_job_download_waits_for_the_running_one_only(
    server: FileServer, tmp_path: Path
) -> None:
    p1 = serve(server, "p1", hold_at=64 * KIB)
    p2, p3, job = serve(server, "p2"), serve(server, "p3"), serve(server, "job")
    async with agent(tmp_path, parallel=1, preempt_prefetch=False) as models:
        downloader = models.downloader
        futures = {s.name: downloader.prefetch(s) for s in (p1, p2, p3)}
        await server.arrived("p1", 2)  # its second chunk is stalled
        futures["job"] = downloader.request(job, job_id="job-1")
        order = finish_order(futures)
        assert [p.model for p in downloader.progress()] == ["job", "p1", "p2", "p3"]
        server.release("p1")
        await asyncio.gather(*futures.values())
    assert order == ["p1", "job", "p2", "p3"]


async def test_progress_is_reported_per_model_and_per_waiting_job(
    server: FileServer, tmp_path: Path
) -> None:
    spec = serve(server, "x", hold_at=128 * KIB)
    seen: list[DownloadProgress] = []
    async with agent(tmp_path, progress_step=0.25) as models:
        downloader = models.downloader
        downloader.add_listener(seen.append)
        waiting = asyncio.ensure_future(downloader.ensure(spec, job_id="job-7"))
        await server.arrived("x", 3)
        assert [p.message for p in downloader.waiting_for("job-7")] == ["waiting for model x: 64%"]
        assert downloader.waiting_for("job-other") == []
        server.release("x")
        await waiting
    assert seen[0].state is DownloadState.QUEUED
    assert seen[0].jobs == ()  # published before job-7 joined
    assert seen[-1].message == "model x is ready"
    fetching = [p.percent for p in seen if p.state is DownloadState.FETCHING]
    assert fetching == sorted(fetching)
    assert len(fetching) <= 1 + 4 + 4  # the start, one per 25%, one per chunk: throttled
    assert all(p.jobs == ("job-7",) for p in seen[1:-1])


async def test_watch_streams_progress_until_the_downloader_closes(
    server: FileServer, tmp_path: Path
) -> None:
    spec = serve(server, "x")
    async with agent(tmp_path) as models:
        stream = models.downloader.watch()
        collected = asyncio.ensure_future(_collect(stream))
        await asyncio.sleep(0)  # the watcher subscribes
        await models.downloader.ensure(spec)
    states = [p.state for p in await collected]
    assert states[-1] is DownloadState.DONE  # coalesced per model, the last one is kept


async def _collect(stream: object) -> list[DownloadProgress]:
    return [p async for p in stream]  # type: ignore[attr-defined]


async def test_a_cancelled_job_leaves_its_download_running_as_a_prefetch(
    server: FileServer, tmp_path: Path
) -> None:
    spec = serve(server, "x", hold_at=64 * KIB)
    async with agent(tmp_path) as models:
        waiting = asyncio.ensure_future(models.downloader.ensure(spec, job_id="job-1"))
        await server.arrived("x", 2)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert models.downloader.progress()[0].jobs == ()
        server.release("x")
        await reached(models, lambda p: p.state is DownloadState.DONE)
        assert models.on_disk() == ("x",)


async def test_a_model_in_use_stays_while_downloads_evict_around_it(
    server: FileServer, tmp_path: Path
) -> None:
    specs = [serve(server, name) for name in ("p1", "p2", "p3")]
    async with (
        agent(tmp_path, budget=2 * SIZE) as models,
        models.use(specs[0], job_id="job-1") as path,
    ):
        await models.downloader.ensure(specs[1])
        await models.downloader.ensure(specs[2])  # evicts p2, never p1
        assert models.on_disk() == ("p1", "p3")
        assert path.read_bytes() == DATA["p1"]
        async with models.use(specs[2], job_id="job-2"):
            with pytest.raises(CacheFull, match="no room for model p2"):
                await models.downloader.ensure(specs[1], job_id="job-3")


async def test_two_agents_share_one_file_server(server: FileServer, tmp_path: Path) -> None:
    p1, p2 = serve(server, "p1", drop_at=100 * KIB), serve(server, "p2")
    x = serve(server, "x")
    async with (
        agent(tmp_path, "agent-a", budget=2 * SIZE) as a,
        agent(tmp_path, "agent-b", budget=2 * SIZE) as b,
    ):
        await asyncio.gather(*(m.downloader.ensure(s) for m in (a, b) for s in (p1, p2)))
        assert a.on_disk() == b.on_disk() == ("p1", "p2")
        for models in (a, b):
            for spec in (p1, p2):
                assert models.cache.blob_path(spec.sha256).read_bytes() == DATA[spec.name]
        async with a.use(p2):
            pass  # agent a used p2 last, so p1 is its least recently used
        await a.downloader.ensure(x)
        assert a.on_disk() == ("p2", "x")
        assert b.on_disk() == ("p1", "p2")  # each agent's cache is its own
    agents = {hit.agent for hit in server.hits("p1")}
    assert agents == {"agent-a", "agent-b"}
    assert (
        len([h for h in server.hits("p1") if h.range == f"bytes={100 * KIB}-{164 * KIB - 1}"]) == 1
    )
