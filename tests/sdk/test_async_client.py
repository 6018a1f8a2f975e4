"""``AsyncClient`` against the server processes: the same API, awaited."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from flaky_proxy import FlakyProxy
from live_server import FAST_RETRY, Running, touch_when

from corral.core.states import JobState
from corral.sdk import AsyncClient, BadRequest, JobFailed, NotFound, WaitTimeout

pytestmark = pytest.mark.anyio


async def test_submit_follow_and_fetch_the_result(stub: Running, team: str, tmp_path: Path) -> None:
    async with AsyncClient(stub.url, stub.token, retry=FAST_RETRY) as corral:
        job = await corral.submit(
            kind="sample", team=team, gpus=0.5, payload={"steps": 2, "preview": True}
        )
        assert job.status.resources.gpu_milli == 500
        kinds = [e.kind async for e in job.events()]
        assert kinds[-1] == "job.succeeded"
        assert kinds.count("job.preview") == 2

        result = await job.result(timeout=10)
        assert await result.read() == f"done {job.id}".encode()
        saved = await result.save(tmp_path)
        assert [p.name for p in saved] == ["out.txt"]
        assert [j.id for j in await corral.jobs(team=team)] == [job.id]


async def test_wait_timeout_cancel_and_errors(stub: Running, team: str, gate: Path) -> None:
    async with AsyncClient(stub.url, stub.token, retry=FAST_RETRY) as corral:
        job = await corral.submit(team=team, payload={"steps": 1, "gate": str(gate)})
        with pytest.raises(WaitTimeout):
            await job.wait(timeout=0.3)
        await job.cancel()
        assert (await job.wait(timeout=10)).state is JobState.CANCELLED
        with pytest.raises(JobFailed):
            await job.result()
        with pytest.raises(NotFound):
            await corral.job("job_missing")
        with pytest.raises(BadRequest) as err:
            await corral.submit_many([{"team": team}, {"team": team, "gpus": -2}])
        assert err.value.field == "jobs[1].resources.gpus"


async def test_async_events_resume_after_a_drop(
    stub: Running, make_proxy: Callable[[int], FlakyProxy], team: str, gate: Path
) -> None:
    proxy = make_proxy(stub.port)
    async with AsyncClient(proxy.url, stub.token, retry=FAST_RETRY) as corral:
        job = await corral.submit(team=team, payload={"steps": 3, "gate": str(gate)})
        stream = job.events()
        touch_when(lambda: stream.reconnects > 0, gate)
        seqs = []
        async for event in stream:
            seqs.append(event.seq)
            if event.kind == "job.started":
                assert proxy.cut() > 0
        assert stream.reconnects >= 1
        assert seqs == [e.seq async for e in corral.events(job.id)]
        ends = [e.kind async for e in job.events(kinds=["job.started", "job.succeeded"])]
        assert ends == ["job.started", "job.succeeded"]


async def test_nodes_teams_and_queue(server: Running, team: str) -> None:
    async with AsyncClient(server.url, server.token, retry=FAST_RETRY) as corral:
        assert await corral.nodes() == []
        job = await corral.submit(team=team)
        queue = await corral.queue(limit=1000)
        assert job.id in [e.job.id for e in queue.entries]
        team_quota = await corral.set_team(team, quota=1.5)
        assert team_quota.quota_gpus == 1.5
        assert team in [t.name for t in await corral.teams()]


async def test_hold_release_top_edit_and_deliveries_awaited(server: Running, team: str) -> None:
    async with AsyncClient(server.url, server.token, retry=FAST_RETRY) as corral:
        job = await corral.submit(team=team, gpus=1, labels={"run": "a"})
        assert job.status.labels == {"run": "a"}
        assert (await job.hold()).held
        assert job.status.queue is not None
        assert job.status.queue.reasons[0].code == "held"
        assert not (await job.release()).held
        assert (await job.top()).state is JobState.QUEUED
        edited = await corral.edit_job(job.id, priority="paid", timeout_s=30, labels={})
        assert (edited.priority, edited.timeout_s, edited.labels) == ("paid", 30, {})
        with pytest.raises(BadRequest) as err:
            await corral.edit_job(job.id, priority="gold")
        assert err.value.field == "priority"
        assert await job.deliveries() == []
        secret = await corral.webhook_secret()
        assert secret.startswith("whsec_")
        assert await corral.webhook_secret() == secret
        await job.cancel()
