"""Usage through the real server: a day of jobs replayed, the report summed against the
allocations that ran them (on SQLite and PostgreSQL).

The report must agree with what quota counted: each allocation holds its
milli-GPUs from placement to its end, so the sums per team, user, class and
pool equal the allocations' held time x share, ended ones and running ones
up to now, and cost is GPU-hours at the pool's price.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from server_harness import World

from corral.server.agentlink.base import Assignment
from corral.server.agentlink.inprocess import StubAgent
from corral.server.app import create_app
from corral.server.store.tables import allocations

pytestmark = pytest.mark.anyio

HOME_PRICE = 0.8  # per GPU-hour, set by the policy for pool "home"
POLICY = f"""\
format: 1
classes:
  - {{name: paid, rank: 30, may_preempt: true}}
  - {{name: free, rank: 20}}
  - {{name: batch, rank: 10, cpu_offload: true}}
pools:
  home: {{gpu_hour: {HOME_PRICE}}}
"""
TEAMS = ("lab", "studio")
USERS = ("ana", "bo", "cy")
CLASSES = ("paid", "free", "batch")
SHARES = (1, 1, 2, 0.5, 0.25)  # whole cards, two cards, shared cards


@pytest.fixture
async def api(world: World) -> AsyncIterator[httpx.AsyncClient]:
    report = world.plane.report
    assert report is not None
    assert report.admin_token
    app = create_app(plane=world.plane)
    headers = {"Authorization": f"Bearer {report.admin_token}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://corral", headers=headers
    ) as c:
        yield c


async def test_a_replayed_day_sums_to_its_allocations(world: World, api: httpx.AsyncClient) -> None:
    put = await api.put("/v1/policy", json={"document": POLICY})
    assert put.status_code == 200, put.text
    agents = [
        await world.agent("home-1", gpus=4, labels={"pool": "home"}),
        await world.agent("rented-1", gpus=2),
    ]
    start = world.clock.now()
    await replay_day(world, agents, random.Random(7))
    now = world.clock.now()

    want = await held_by_allocations(world, now)
    assert len(want) >= 6  # the day spread over many teams, users, classes and pools
    got = await api.get("/v1/usage", params={"by": "team,user,class,pool", "from": start - 1})
    assert got.status_code == 200, got.text
    rows = {(r["team"], r["user"], r["class"], r["pool"]): r for r in got.json()["rows"]}
    assert set(rows) == set(want)
    for key, (milli_s, cpu_s, jobs) in want.items():
        row = rows[key]
        assert row["milli_gpu_seconds"] == pytest.approx(milli_s), key
        assert row["gpu_seconds"] == pytest.approx(milli_s / 1000), key
        assert row["cpu_seconds"] == pytest.approx(cpu_s), key
        assert row["jobs"] == jobs, key
        price = HOME_PRICE if key[3] == "home" else 0.0
        assert row["cost"] == pytest.approx(milli_s / 1000 / 3600 * price, abs=1e-5), key
    total = got.json()["total"]
    assert total["milli_gpu_seconds"] == pytest.approx(sum(w[0] for w in want.values()))

    # by day: the same seconds, split at midnight (UTC)
    days = (await api.get("/v1/usage", params={"by": "day", "from": start - 1})).json()
    assert len(days["rows"]) == 2
    assert sum(r["milli_gpu_seconds"] for r in days["rows"]) == pytest.approx(
        total["milli_gpu_seconds"]
    )


async def test_a_team_token_sees_its_own_team_and_bad_queries_are_named(
    world: World, api: httpx.AsyncClient
) -> None:
    agent = await world.agent("n1", gpus=1)
    await world.submit(resources={"gpus": 1}, team="lab", user="ana")
    await world.cycle()
    await agent.start(await agent.next_assignment())
    world.clock.advance(600)
    made = await api.post("/v1/tokens", json={"kind": "team", "name": "s", "team": "studio"})
    studio = {"Authorization": f"Bearer {made.json()['token']}"}
    theirs = (await api.get("/v1/usage", headers=studio)).json()
    assert theirs["rows"] == []
    ours = (await api.get("/v1/usage")).json()
    assert [(r["team"], r["gpu_seconds"]) for r in ours["rows"]] == [("lab", 600.0)]
    bad = await api.get("/v1/usage", params={"by": "team,colour"})
    assert bad.status_code == 422
    assert bad.json()["field"] == "by"
    far = await api.get("/v1/usage", params={"to": "1e300"})
    assert far.status_code == 422
    assert far.json()["field"] == "to"
    when = await api.get("/v1/usage", params={"from": "yesterday"})
    assert when.status_code == 422
    assert when.json()["field"] == "from"
    text = (await api.get("/metrics")).text
    assert "corral_usage_gpu_seconds_total" in text


async def replay_day(world: World, agents: list[StubAgent], rng: random.Random) -> None:
    """Jobs arrive every 20 minutes from midday to midday; each runs 5 to 90 minutes, a
    few fail; what is still running at the end stays running."""
    clock = world.clock
    clock.advance(86400 - clock.now() % 86400 + 12 * 3600)  # noon: the day spans midnight
    running: list[tuple[float, StubAgent, Assignment]] = []
    for step in range(72):
        for _ in range(rng.randint(0, 3)):
            gpus = rng.choice(SHARES)
            spec: dict[str, Any] = {"resources": {"gpus": gpus, "cpus": rng.randint(1, 4)}}
            if gpus >= 1 and rng.random() < 0.2:
                spec["priority"] = "batch"
                spec["resources"]["cpu_fallback"] = True
            else:
                spec["priority"] = rng.choice(CLASSES[:2])
            await world.submit(team=rng.choice(TEAMS), user=rng.choice(USERS), **spec)
        await world.cycle()
        for agent in agents:
            for item in agent.pending():
                if isinstance(item, Assignment):
                    await agent.start(item)
                    running.append((clock.now() + rng.uniform(300, 5400), agent, item))
                    continue
                for entry in [r for r in running if r[2].allocation_id == item.allocation_id]:
                    running.remove(entry)  # preempted: it stops at once
                    await agent.stopped(entry[2])
        clock.advance(1200)
        if step == 71:
            break
        for end, agent, a in [r for r in running if r[0] <= clock.now()]:
            running.remove((end, agent, a))
            if rng.random() < 0.1:
                await agent.fail(a, "boom", retryable=False)
            else:
                await agent.finish(a)


async def held_by_allocations(
    world: World, now: float
) -> dict[tuple[str, ...], tuple[float, float, int]]:
    """Per (team, user, class, pool): milli-GPU-seconds, CPU-seconds and jobs ended, from the
    allocations table itself."""
    out: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    async with world.plane.rt.db.read() as conn:
        rows = list(await conn.execute(sa.select(allocations)))
    for r in rows:
        pool = "home" if r.node.startswith("home") else ""
        held = (r.ended_at if r.ended_at is not None else now) - r.created_at
        milli = 0 if r.on_cpu else r.gpu_milli * len(r.gpu_indices)
        entry = out[(r.team, r.user, r.priority, pool)]
        entry[0] += milli * held
        entry[1] += r.cpus * held
        if r.ended_at is not None and r.replica == 0:
            entry[2] += len(r.job_ids)
    return {k: (v[0], v[1], int(v[2])) for k, v in out.items()}
