"""The server's side of the wire, against a hand-driven agent: auth, fencing, idempotent results."""

from __future__ import annotations

import asyncio
import hashlib
import os

import grpc
import pytest
from e2e_harness import Cluster, eventually, job, submit, wait_state
from raw_agent import RawAgent, chunks

from corral.proto.gen.corral.v1 import agent_pb2 as pb

pytestmark = pytest.mark.slow


def test_tokens_are_checked_before_anything_else(cluster: Cluster) -> None:
    cluster.start_server()
    agent = cluster.start_agent("a1", token="corral_agent_not-a-real-token", wait=False)
    with cluster.client() as http:
        reply = http.post("/v1/tokens", json={"kind": "team", "name": "t", "team": "t1"})
        team_token = reply.json()["token"]

    async def refused(token: str | None) -> grpc.aio.AioRpcError:
        agent = RawAgent(cluster.agents_url, token)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await agent.knock()  # refused before any message: no hello needed
            return caught.value
        finally:
            await agent.close()

    async def scenario() -> None:
        missing = await refused(None)
        assert missing.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "missing agent join token" in (missing.details() or "")
        wrong = await refused("corral_agent_nope")
        assert wrong.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "unknown token" in (wrong.details() or "")
        team = await refused(team_token)
        assert team.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "team token cannot join" in (team.details() or "")

    asyncio.run(scenario())
    assert agent.popen.wait(20) == 3  # `corral agent` gives up at once, and says why
    agent.wait_for(r"refused this agent: agent token rejected: unknown token")


def test_a_stale_attempt_is_fenced_out_and_results_count_once(cluster: Cluster) -> None:
    """ghost takes attempt 1, goes silent and is declared lost; the job comes back to it as
    attempt 2. Its late result for attempt 1 is refused; attempt 2's result, uploaded in
    chunks, cut off and resumed, then sent twice, is recorded once."""
    cluster.start_server(node_timeout=1.0)
    big = os.urandom(300_000)  # larger than an inline result: goes through UploadBlob
    sha = hashlib.sha256(big).hexdigest()

    async def scenario() -> str:
        ghost = RawAgent(cluster.agents_url, "corral_admin_e2e-test-admin-token")
        try:
            await ghost.connect()
            with cluster.client() as http:
                job_id = submit(http, payload={"steps": 1})["id"]
            first = await ghost.expect("assign")
            assert first.attempt == 1
            assert [w.job_id for w in first.jobs] == [job_id]
            assert await ghost.update(first.allocation_id, 1, started=pb.Started()) == "accepted"
            with cluster.client() as http:  # no heartbeats: ghost is lost, the job requeued
                eventually(lambda: job(http, job_id)["state"] == "queued", what="requeue")
            await ghost.connect(running=[(first.allocation_id, 1)])
            stop = await ghost.expect("stop")
            assert stop.allocation_id == first.allocation_id  # the server no longer wants it
            second = await ghost.expect("assign")
            assert second.attempt == 2
            assert second.allocation_id != first.allocation_id

            late = pb.Finished(results=[pb.Result(name="r.txt", data=b"old", job_id=job_id)])
            assert await ghost.update(first.allocation_id, 1, finished=late) == "stale"

            blob = await resumed_upload(ghost, second.allocation_id, big, sha)
            again = await ghost.upload(chunks(second.allocation_id, 2, big, sha256=sha))
            assert again.blob_id == blob  # a retried upload is the same blob
            result = pb.Result(name="big.bin", blob_id=blob, job_id=job_id)
            done = pb.Finished(results=[result])
            assert await ghost.update(second.allocation_id, 2, finished=done) == "accepted"
            assert await ghost.update(second.allocation_id, 2, finished=done) == "duplicate"
            return job_id
        finally:
            await ghost.close()

    job_id = asyncio.run(scenario())
    with cluster.client() as http:
        done = wait_state(http, job_id, "succeeded")
        assert done["attempt"] == 2
        [file] = done["result"]  # one result, from attempt 2 only
        assert file["sha256"] == sha
        assert http.get(file["url"]).content == big


async def resumed_upload(ghost: RawAgent, allocation_id: str, data: bytes, sha: str) -> str:
    """Send the first half, then (as after a broken connection) probe and send the rest."""
    half = await ghost.upload(chunks(allocation_id, 2, data, sha256=sha, stop=150_000))
    assert half.blob_id == ""
    assert half.received == 150_000
    probe = await ghost.upload(chunks(allocation_id, 2, data, sha256=sha, probe=True))
    assert probe.received == 150_000
    rest = await ghost.upload(chunks(allocation_id, 2, data, sha256=sha, start=150_000))
    assert rest.blob_id.endswith(sha)
    assert rest.received == len(data)
    return str(rest.blob_id)
