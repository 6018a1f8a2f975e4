"""ETAs through the HTTP API: a queued job's expected start, a running job's expected end,
learned from the jobs that finished (on SQLite and PostgreSQL, a virtual clock)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.clock import VirtualClock
from corral.server.agentlink.inprocess import InProcessLink, StubAgent, inventory
from corral.server.app import create_app, create_plane
from corral.server.plane import ControlPlane
from corral.server.settings import Settings

pytestmark = pytest.mark.anyio

TOKEN = "corral_admin_eta-test-token-0123456789"
START = 1_000_000.0


class Site:
    def __init__(self, plane: ControlPlane, clock: VirtualClock, link: InProcessLink) -> None:
        self.plane, self.clock, self.link = plane, clock, link
        headers = {"Authorization": f"Bearer {TOKEN}"}
        transport = httpx.ASGITransport(create_app(plane=plane))
        self.http = httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers)

    async def submit(self, **spec: Any) -> str:
        r = await self.http.post("/v1/jobs", json={"kind": "custom", **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def cycle_after(self, seconds: float) -> None:
        """Time passes, then a cycle (an estimate is made at most once a second)."""
        self.clock.advance(seconds)
        await self.plane.schedule.cycle()


@pytest.fixture
async def site(db_url: str, tmp_path: Path) -> AsyncIterator[Site]:
    settings = Settings(
        home=tmp_path,
        admin_token=TOKEN,  # type: ignore[arg-type]
        store={"db": db_url},  # type: ignore[arg-type]
    )
    clock, link = VirtualClock(START), InProcessLink()
    plane = create_plane(settings, link=link, clock=clock, run_loops=False)
    await plane.start()
    s = Site(plane, clock, link)
    try:
        yield s
    finally:
        await s.http.aclose()
        await plane.stop()


async def test_a_queued_job_expects_to_start_when_the_running_one_should_end(site: Site) -> None:
    agent = StubAgent(site.plane.agents, site.link, inventory("n1", 1))
    await agent.connect()
    first = await site.submit(resources={"gpus": 1}, estimated_runtime_s=600)
    await site.cycle_after(0)
    running = await agent.next_assignment()
    await agent.start(running)
    began = site.clock.now()

    second = await site.submit(resources={"gpus": 1}, estimated_runtime_s=300)
    await site.cycle_after(2)
    queued = await site.job(second)
    assert queued["state"] == "queued"
    eta = queued["eta"]
    assert eta["basis"] == "estimate", "nothing finished yet: the job's own estimate"
    assert eta["start_at"] == pytest.approx(began + 600), "the one card frees when A ends"
    assert eta["end_at"] == pytest.approx(began + 900)
    assert eta["runtime_s"] == pytest.approx(300)
    assert eta["computed_at"] == pytest.approx(site.clock.now())

    ahead = (await site.job(first))["eta"]
    assert ahead["start_at"] is None
    assert ahead["end_at"] == pytest.approx(began + 600)

    r = await site.http.get("/v1/queue")
    assert r.status_code == 200
    [entry] = r.json()["entries"]
    assert entry["job"]["id"] == second
    assert entry["job"]["eta"]["start_at"] == pytest.approx(began + 600)


async def test_run_times_are_learned_from_finished_jobs(site: Site) -> None:
    """A finished in a sixth of its stated 600 s: B's stated 300 s is read as padded too,
    and C, queued behind B, is expected sooner than B's stated run time."""
    agent = StubAgent(site.plane.agents, site.link, inventory("n1", 1))
    await agent.connect()
    first = await site.submit(resources={"gpus": 1}, estimated_runtime_s=600)
    await site.cycle_after(0)
    a = await agent.next_assignment()
    await agent.start(a)
    second = await site.submit(resources={"gpus": 1}, estimated_runtime_s=300)
    site.clock.advance(100)
    await agent.finish(a)
    assert (await site.job(first))["state"] == "succeeded"
    assert (await site.job(first))["eta"] is None, "an ended job has no ETA"

    await site.cycle_after(1)
    b = await agent.next_assignment()
    assert b.jobs[0].job_id == second
    await agent.start(b)
    began = site.clock.now()
    third = await site.submit(resources={"gpus": 1}, estimated_runtime_s=300)
    await site.cycle_after(2)

    running = (await site.job(second))["eta"]
    assert running["basis"] == "estimate"
    assert running["runtime_s"] < 300, "history says estimates here are padded"
    waiting = (await site.job(third))["eta"]
    assert waiting["start_at"] == pytest.approx(running["end_at"])
    assert waiting["start_at"] < began + 300


async def test_a_job_no_node_can_run_is_never_expected_to_start(site: Site) -> None:
    agent = StubAgent(site.plane.agents, site.link, inventory("n1", 1))
    await agent.connect()
    job = await site.submit(resources={"gpus": 4})
    await site.cycle_after(0)
    eta = (await site.job(job))["eta"]
    assert eta["start_at"] is None
    assert eta["end_at"] is None
    assert eta["basis"] == "never"


async def test_a_failing_estimate_leaves_the_cycle_and_the_last_etas_standing(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = StubAgent(site.plane.agents, site.link, inventory("n1", 1))
    await agent.connect()
    running = await site.submit(resources={"gpus": 1}, estimated_runtime_s=100)
    queued = await site.submit(resources={"gpus": 1}, estimated_runtime_s=100)
    await site.cycle_after(0)
    before = (await site.job(queued))["eta"]
    assert before["start_at"] is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the forecast")

    monkeypatch.setattr("corral.server.loops.etas.estimate", broken)
    third = await site.submit(resources={"gpus": 1})
    await site.cycle_after(5)  # the estimate is due (a queued job has none) and fails
    assert (await site.job(running))["state"] in ("placed", "running")
    assert (await site.job(queued))["eta"]["start_at"] == before["start_at"]
    assert (await site.job(third))["state"] == "queued"
