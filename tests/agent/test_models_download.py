"""Downloads from real HTTP servers on loopback: Range chunks, drops, corruption, retries."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_fixtures import KIB, FileServer, JumpClock, agent, blob, file_server, spec_for

from corral.agent.models import DownloadFailed, DownloadState, IntegrityError, ModelSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SIZE = 300 * KIB  # five 64 KiB chunks (the harness's chunk size), the last one short
DATA = blob(SIZE, seed=7)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server() -> Iterator[FileServer]:
    with file_server() as s:
        yield s


def ranges(server: FileServer, path: str) -> list[str | None]:
    return [hit.range for hit in server.hits(path)]


async def test_a_model_arrives_in_range_chunks_and_is_verified(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("sdxl-base", DATA, server.add("sdxl.safetensors", DATA))
    async with agent(tmp_path) as models:
        path = await models.downloader.ensure(spec, job_id="job-1")
        assert path.read_bytes() == DATA
        assert models.on_disk() == ("sdxl-base",)
    starts = range(0, SIZE, 64 * KIB)
    want = [f"bytes={s}-{min(s + 64 * KIB, SIZE) - 1}" for s in starts]
    assert ranges(server, "sdxl.safetensors") == want
    assert {hit.status for hit in server.hits("sdxl.safetensors")} == {206}


async def test_a_dropped_connection_resumes_where_it_stopped(
    server: FileServer, tmp_path: Path
) -> None:
    url = server.add("m", DATA, drop_at=150 * KIB)
    clock = JumpClock()
    async with agent(tmp_path, clock=clock) as models:
        path = await models.downloader.ensure(spec_for("m", DATA, url))
        assert path.read_bytes() == DATA
    resumed = f"bytes={150 * KIB}-{214 * KIB - 1}"  # a whole chunk from where it stopped
    assert ranges(server, "m")[2:4] == ["bytes=131072-196607", resumed]
    assert clock.sleeps == [1.0]  # one backoff before the retry, then it went on


async def test_an_interrupted_download_resumes_after_an_agent_restart(
    server: FileServer, tmp_path: Path
) -> None:
    url = server.add("m", DATA, hold_at=128 * KIB)  # a slow link: stalls at the third chunk
    spec = spec_for("m", DATA, url)
    async with agent(tmp_path) as models:
        models.prefetch(spec)
        await server.arrived("m", 3)
        assert models.downloader.progress()[0].bytes_done == 128 * KIB
    # the agent stopped mid-download; its partial file stays
    partial = tmp_path / "agent-a" / "partial" / f"{spec.sha256}.part"
    assert partial.stat().st_size == 128 * KIB
    server.release("m")
    async with agent(tmp_path) as models:
        assert (await models.downloader.ensure(spec)).read_bytes() == DATA
    assert ranges(server, "m")[2:] == [
        "bytes=131072-196607",  # stalled when the agent stopped
        "bytes=131072-196607",  # after the restart: on from there, nothing twice
        "bytes=196608-262143",
        f"bytes=262144-{SIZE - 1}",
    ]
    assert not partial.exists()


async def test_a_server_that_ignores_range_restarts_cleanly(
    server: FileServer, tmp_path: Path
) -> None:
    url = server.add("m", DATA, ignore_range=True, drop_at=100 * KIB)
    async with agent(tmp_path) as models:
        path = await models.downloader.ensure(spec_for("m", DATA, url))
        assert path.read_bytes() == DATA
    hits = server.hits("m")
    assert [h.status for h in hits] == [200, 200]
    assert hits[1].range == f"bytes={100 * KIB}-{164 * KIB - 1}"  # asked to resume, got it all


async def test_a_corrupted_file_is_deleted_and_the_error_names_both_hashes(
    server: FileServer, tmp_path: Path
) -> None:
    url = server.add("m", DATA, corrupt=True)
    spec = spec_for("sdxl-base", DATA, url)
    bad = bytearray(DATA)
    bad[SIZE // 2] ^= 0xFF
    served_hash = hashlib.sha256(bad).hexdigest()
    async with agent(tmp_path) as models:
        with pytest.raises(DownloadFailed) as caught:
            await models.downloader.ensure(spec)
        assert models.on_disk() == ()
    error = caught.value.errors[0]
    assert isinstance(error, IntegrityError)
    assert (error.model, error.expected, error.actual) == ("sdxl-base", spec.sha256, served_hash)
    assert f"model sdxl-base: sha256 mismatch from {url}" in str(caught.value)
    assert spec.sha256 in str(caught.value)
    assert served_hash in str(caught.value)
    assert list((tmp_path / "agent-a" / "partial").iterdir()) == []
    assert list((tmp_path / "agent-a" / "blobs").iterdir()) == []


async def test_a_corrupted_source_falls_back_to_the_next(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("m", DATA, server.add("bad", DATA, corrupt=True), server.add("good", DATA))
    async with agent(tmp_path) as models:
        assert (await models.downloader.ensure(spec)).read_bytes() == DATA
        edges = [(t.current, t.target) for t in models.downloader.history("m")]
    assert ("verifying", "fetching") in edges
    assert edges[-1] == ("verifying", "done")
    assert len(server.hits("good")) == 5  # from byte 0: the bad bytes were thrown away


async def test_transient_errors_back_off_exponentially_then_succeed(
    server: FileServer, tmp_path: Path
) -> None:
    url = server.add("m", DATA, statuses=[503, 503, 429])
    clock = JumpClock()
    async with agent(tmp_path, clock=clock) as models:
        assert (await models.downloader.ensure(spec_for("m", DATA, url))).read_bytes() == DATA
        states = [t.target for t in models.downloader.history("m")]
    assert clock.sleeps == [1.0, 2.0, 4.0]
    assert states.count(DownloadState.RETRYING) == 3


async def test_retry_after_is_honoured_up_to_the_cap(server: FileServer, tmp_path: Path) -> None:
    url = server.add("m", DATA, statuses=[429, 503], retry_after=7)
    clock = JumpClock()
    async with agent(tmp_path, clock=clock, backoff_max_s=5.0) as models:
        assert (await models.downloader.ensure(spec_for("m", DATA, url))).read_bytes() == DATA
    assert clock.sleeps == [5.0, 5.0]  # the server asked for 7 s; the agent's cap is 5 s


async def test_a_source_whose_file_shrank_is_refused_after_starting_over(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("m", DATA, server.add("m", DATA[: 100 * KIB]))
    partial = tmp_path / "agent-a" / "partial" / f"{spec.sha256}.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(DATA[: 150 * KIB])  # from an earlier run, when the file was whole
    async with agent(tmp_path) as models:
        with pytest.raises(DownloadFailed, match=f"serves {100 * KIB} bytes"):
            await models.downloader.ensure(spec)
    assert [h.status for h in server.hits("m")] == [416, 206]
    assert not partial.exists()


async def test_a_missing_source_falls_back_without_waiting(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("m", DATA, server.url("gone"), server.add("m", DATA))
    clock = JumpClock()
    async with agent(tmp_path, clock=clock) as models:
        assert (await models.downloader.ensure(spec)).read_bytes() == DATA
    assert [h.status for h in server.hits("gone")] == [404]
    assert clock.sleeps == []


async def test_every_source_failing_is_one_clear_error(server: FileServer, tmp_path: Path) -> None:
    busy = server.add("busy", DATA, statuses=[503] * 10)
    spec = spec_for("sdxl-base", DATA, server.url("gone"), busy)
    clock = JumpClock()
    async with agent(tmp_path, clock=clock, retries=2) as models:
        with pytest.raises(DownloadFailed) as caught:
            await models.downloader.ensure(spec, job_id="job-9")
        assert models.downloader.waiting_for("job-9") == []
    message = str(caught.value)
    assert message.startswith("model sdxl-base could not be downloaded:")
    assert f"{server.url('gone')}: HTTP 404" in message
    assert f"{busy}: HTTP 503" in message
    assert clock.sleeps == [1.0, 2.0]  # two retries of the busy source, none of the 404


async def test_a_source_serving_another_size_is_refused(server: FileServer, tmp_path: Path) -> None:
    url = server.add("m", DATA + b"extra")
    async with agent(tmp_path) as models:
        with pytest.raises(
            DownloadFailed, match=f"serves {SIZE + 5} bytes; the registry says {SIZE}"
        ):
            await models.downloader.ensure(spec_for("m", DATA, url))


async def test_a_file_source_is_used_when_the_url_is_down(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/m"
    shared = tmp_path / "shared" / "m.safetensors"
    shared.parent.mkdir()
    shared.write_bytes(DATA)
    clock = JumpClock()
    async with agent(tmp_path, clock=clock, retries=1) as models:
        spec = spec_for("m", DATA, dead, shared.as_uri())
        assert (await models.downloader.ensure(spec)).read_bytes() == DATA
    assert clock.sleeps == [1.0]


async def test_a_model_already_on_disk_needs_no_network(server: FileServer, tmp_path: Path) -> None:
    spec = spec_for("m", DATA, server.add("m", DATA))
    async with agent(tmp_path) as models:
        await models.downloader.ensure(spec)
    async with agent(tmp_path) as models:  # a restart
        assert (await models.downloader.ensure(spec)).read_bytes() == DATA
        alias = ModelSpec("m-v2-alias", spec.size, spec.sha256, spec.sources)
        await models.downloader.ensure(alias)  # same bytes, another name: linked, not fetched
        assert models.on_disk() == ("m", "m-v2-alias")
    assert len(server.hits("m")) == 5


async def test_a_file_left_unindexed_by_a_crash_is_re_verified_not_refetched(
    server: FileServer, tmp_path: Path
) -> None:
    spec = spec_for("m", DATA, server.add("m", DATA))
    async with agent(tmp_path) as models:
        await models.downloader.ensure(spec)
    (tmp_path / "agent-a" / "index.json").unlink()  # as if the crash came before the index write
    async with agent(tmp_path) as models:
        assert models.on_disk() == ()
        assert (await models.downloader.ensure(spec)).read_bytes() == DATA
        assert models.on_disk() == ("m",)
    assert len(server.hits("m")) == 5  # only the first download's requests
