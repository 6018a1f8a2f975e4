"""Attack: an agent token leaves uploads unfinished until the server has no descriptors left
(issue 45, item 1).

20,000 unfinished ``UploadBlob`` calls for invented allocation ids once each kept a file
open; with the descriptors gone, ``POST /v1/jobs`` answered 500 for a job it had
committed. Now an upload is taken only from the node its allocation runs on (named and
proven with the node's key), unfinished uploads are capped per node and in all, no file
stays open between chunks, and a committed job is answered 201 whatever fails after.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import resource
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from http_harness import ADMIN_TOKEN, serve
from process_harness import ServerProcess

from corral.proto import caller
from corral.proto.gen.corral.v1 import agent_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from raw_agent import RawAgent

pytestmark = pytest.mark.anyio

PER_NODE, TOTAL = 4, 6
KEY1, KEY2 = "1" * 64, "2" * 64
SLACK_FDS = 16  # the server's own descriptors come and go (database connections, logs)
GRPC_SETTLE_S = 0.2
AT_ONCE = 8  # calls open at once, as a client keeps below agents.max_streams_per_connection


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A real ``corral server`` with small upload caps."""
    env = {
        "CORRAL_ADMIN_TOKEN": ADMIN_TOKEN,
        "CORRAL_AGENTS__MAX_UPLOADS_PER_NODE": str(PER_NODE),
        "CORRAL_AGENTS__MAX_UPLOADS": str(TOTAL),
    }
    process = ServerProcess(db_url, tmp_path / "home", env=env).start()
    try:
        yield process
    finally:
        process.stop()


async def test_uploads_are_refused_unless_they_are_the_callers_live_work_and_are_capped(
    server: ServerProcess,
) -> None:
    agents_url = re.search(r"--server (grpc://\S+)", "\n".join(server.output))
    assert agents_url is not None, server.output
    async with httpx.AsyncClient(base_url=server.url, headers=_bearer(ADMIN_TOKEN)) as http:
        reply = await http.post("/v1/tokens", json={"kind": "agent", "name": "fleet"})
        token = reply.json()["token"]
        n1 = RawAgent(agents_url.group(1), token, node="n1", key=KEY1)
        n2 = RawAgent(agents_url.group(1), token, node="n2", key=KEY2)
        async with _connected(n1, n2):
            await n1.connect()
            mine = await _assigned(http, n1)
            await n2.connect()
            theirs = await _assigned(http, n2)
            fds = _open_fds(server)

            # A few hundred uploads for work that is not the caller's: none opens a file.
            refused = await _codes(
                *(n1.upload(_part(f"al_invented{i}", 1)) for i in range(100)),
                *(n1.upload(_part(*theirs, name=f"x{i}")) for i in range(100)),
                *(n1.upload(_part(*mine, name="y"), node="n2") for _ in range(50)),
                *(n1.upload(_part(*theirs), node="n2", key=KEY1) for _ in range(50)),
            )
            assert set(refused) == {grpc.StatusCode.PERMISSION_DENIED}

            # Its own live allocation: unfinished uploads up to the caps, then refusals.
            for i in range(PER_NODE):
                assert (await n1.upload(_part(*mine, name=f"mine{i}"))).received == 5
            full = await _refusal(n1.upload(_part(*mine, name="one-too-many")))
            assert full.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "agents.max_uploads_per_node" in (full.details() or "")
            assert caller.RETRY_AFTER in dict(full.trailing_metadata() or ())
            for i in range(TOTAL - PER_NODE):
                assert (await n2.upload(_part(*theirs, name=f"theirs{i}"))).received == 5
            over = await _refusal(n2.upload(_part(*theirs, name="over")))
            assert over.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "agents.max_uploads" in (over.details() or "")
            assert _open_fds(server) <= fds + SLACK_FDS, "no descriptor per upload"

            # The rightful uploads still work: one finished, then a whole one.
            done = await n1.upload(_part(*mine, name="mine0", offset=5, data=b"67890"))
            assert done.blob_id == f"uploads/{mine[0]}/{mine[1]}/{_sha(b'1234567890')}"
            whole = await n1.upload(_part(*mine, name="result", data=b"ok", last=True))
            assert whole.blob_id.endswith(_sha(b"ok"))
            assert _open_fds(server) <= fds + SLACK_FDS


async def test_a_committed_job_is_answered_201_with_the_descriptors_used_up(
    tmp_path: Path,
) -> None:
    """The server answered 500 after committing when its descriptors were gone: the fsync
    of the WAL opened the file. Now every 201 is a job that exists, and every job that
    exists was answered 201."""
    db = str(tmp_path / "corral.db")
    async with serve(db, tmp_path / "home") as served:
        http = served.admin
        assert (await http.get("/v1/jobs")).status_code == 200  # the connection, opened now
        with _descriptors_used_up():
            replies = [await http.post("/v1/jobs", json={"payload": {"n": i}}) for i in range(3)]
        accepted = {r.json()["id"] for r in replies if r.status_code == 201}
        assert all(r.status_code == 201 or r.status_code >= 500 for r in replies), replies
        jobs = (await http.get("/v1/jobs")).json()["jobs"]
        assert {j["id"] for j in jobs} == accepted, "answered 201 exactly for what exists"
        assert len(accepted) == 3, [r.text for r in replies]


@contextlib.contextmanager
def _descriptors_used_up() -> Iterator[None]:
    """This process (the in-process server's) cannot open another descriptor meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
    try:
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def _connected(*agents: RawAgent) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for agent in agents:
            await agent.close()
        # gRPC's poller thread may still hand a closed channel's last event to this loop;
        # one arriving once the loop is closed fails the next test (not a timing check).
        await asyncio.sleep(GRPC_SETTLE_S)


async def _assigned(http: httpx.AsyncClient, agent: RawAgent) -> tuple[str, int]:
    """Submit a job and wait for ``agent`` to be given it: (allocation id, attempt)."""
    reply = await http.post("/v1/jobs", json={"payload": {"for": agent.node}})
    assert reply.status_code == 201, reply.text
    work = await agent.expect("assign")
    return str(work.allocation_id), int(work.attempt)


def _part(
    allocation_id: str,
    attempt: int,
    *,
    name: str = "part",
    offset: int = 0,
    data: bytes = b"12345",
    last: bool = False,
) -> Iterator[pb.BlobChunk]:
    """One chunk of an upload (the last one only when ``last``, or when it completes
    ``1234567890``)."""
    done = last or offset + len(data) == 10
    sha = _sha(data) if last else (_sha(b"1234567890") if done else "")
    chunk = pb.BlobChunk(
        allocation_id=allocation_id,
        attempt=attempt,
        name=name,
        offset=offset,
        data=data,
        last=done,
        sha256=sha,
    )
    yield chunk


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _codes(*calls: Awaitable[object]) -> list[grpc.StatusCode]:
    """The status each of ``calls`` ends with, ``AT_ONCE`` of them running at a time."""
    at_once = asyncio.Semaphore(AT_ONCE)

    async def code(call: Awaitable[object]) -> grpc.StatusCode:
        async with at_once:
            return (await _refusal(call)).code()

    return await asyncio.gather(*(code(c) for c in calls))


async def _refusal(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def _open_fds(server: ServerProcess) -> int:
    assert server.proc is not None
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))
