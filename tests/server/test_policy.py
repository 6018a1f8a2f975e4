"""The policy through the real server: applied, checked, versioned, rolled back, enforced.

On SQLite and PostgreSQL: ``GET/PUT /v1/policy`` and its history; submissions
refused for a class the token may not use (403 naming class and team), past a
user's queued cap (429); a class's default time limit; the next cycle
scheduling by the new classes and team caps; a replica seeing another's apply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from http_harness import Served, serve
from server_harness import World

from corral.core.model import Team
from corral.server.services.auth import Principal, TokenKind
from corral.server.services.policy import REFRESH_S

pytestmark = pytest.mark.anyio

SURGE = """\
format: 1
classes:
  - {name: surge, rank: 50, may_preempt: true, allowed: {teams: [ops]}}
  - name: interactive
    rank: 40
    preemptible: false
    may_preempt: true
    allowed: {teams: [ops], users: [ana]}
  - {name: free, rank: 20, default_time_limit_s: 600}
users:
  bob: {weight: 2, max_queued_jobs: 1}
teams:
  research: {max_running_gpus: 1}
"""


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path) as s:
        yield s


async def team_client(s: Served, team: str) -> httpx.AsyncClient:
    r = await s.admin.post("/v1/tokens", json={"kind": "team", "name": f"{team}-ci", "team": team})
    assert r.status_code == 201, r.text
    return s.client(r.json()["token"])


async def test_the_built_in_policy_is_today_s_classes(served: Served) -> None:
    got = (await served.admin.get("/v1/policy")).json()
    assert got["version"] == 0
    classes = {c["name"]: c for c in got["policy"]["classes"]}
    assert [c["rank"] for c in classes.values()] == [40, 30, 20, 10]
    assert classes["interactive"]["preemptible"] is False
    assert classes["batch"]["cpu_offload"] is True
    assert all(c["allowed"] is None for c in classes.values())


async def test_apply_history_and_rollback_keep_every_version(served: Served) -> None:
    r = await served.admin.put("/v1/policy", json={"document": SURGE, "note": "surge class"})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 1
    assert r.json()["applied_by"] == "admin"
    got = (await served.admin.get("/v1/policy")).json()
    assert got["document"] == SURGE
    assert [c["name"] for c in got["policy"]["classes"]] == ["surge", "interactive", "free"]
    assert got["policy"]["teams"]["research"]["max_running_gpus"] == 1

    back = await served.admin.post("/v1/policy/rollback", json={"version": 0})
    assert back.status_code == 200, back.text
    assert back.json()["version"] == 2
    assert back.json()["note"] == "rollback to version 0"
    assert len(back.json()["policy"]["classes"]) == 4
    history = (await served.admin.get("/v1/policy/history")).json()
    assert [(h["version"], h["note"]) for h in history] == [
        (2, "rollback to version 0"),
        (1, "surge class"),
    ]
    old = (await served.admin.get("/v1/policy/versions/1")).json()
    assert old["document"] == SURGE
    missing = await served.admin.post("/v1/policy/rollback", json={"version": 9})
    assert missing.status_code == 404


async def test_a_wrong_document_is_refused_naming_line_and_field(served: Served) -> None:
    bad = SURGE.replace("rank: 40", "rank: high")
    for route in ("/v1/policy/check", "/v1/policy"):
        r = await served.admin.request(
            "PUT" if route == "/v1/policy" else "POST", route, json={"document": bad}
        )
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "classes[1].rank"
        assert "line 5" in r.json()["message"]
    unknown = await served.admin.post("/v1/policy/check", json={"document": SURGE + "colour: 3\n"})
    assert unknown.json()["field"] == "colour"
    assert (await served.admin.get("/v1/policy")).json()["version"] == 0  # nothing applied
    ok = await served.admin.post("/v1/policy/check", json={"document": SURGE})
    assert ok.status_code == 200
    assert ok.json()["ok"] is True


async def test_team_tokens_may_not_read_or_change_the_policy(served: Served) -> None:
    team = await team_client(served, "research")
    async with team:
        assert (await team.get("/v1/policy")).status_code == 403
        assert (await team.put("/v1/policy", json={"document": SURGE})).status_code == 403
        assert (await team.get("/v1/policy/history")).status_code == 403
        assert (await team.post("/v1/policy/rollback", json={"version": 0})).status_code == 403


async def test_submissions_follow_the_classes_the_policy_opens(served: Served) -> None:
    assert (await served.admin.put("/v1/policy", json={"document": SURGE})).status_code == 200
    research, ops = await team_client(served, "research"), await team_client(served, "ops")
    async with research, ops:
        job = {"resources": {"gpus": 1}, "user": "carl"}
        refused = await research.post("/v1/jobs", json={**job, "priority": "interactive"})
        assert refused.status_code == 403, refused.text
        assert "'interactive'" in refused.json()["message"]
        assert "'research'" in refused.json()["message"]
        # the user the class names may use it from any team
        ana = await research.post(
            "/v1/jobs", json={**job, "priority": "interactive", "user": "ana"}
        )
        assert ana.status_code == 201, ana.text
        assert (await ops.post("/v1/jobs", json={**job, "priority": "surge"})).status_code == 201
        gone = await research.post("/v1/jobs", json={**job, "priority": "batch"})
        assert gone.status_code == 422
        assert gone.json()["field"] == "priority"
        free = await research.post("/v1/jobs", json={**job, "priority": "free"})
        assert free.json()["timeout_s"] == 600  # the class's default time limit
        own = await research.post("/v1/jobs", json={**job, "timeout_s": 5})
        assert own.json()["timeout_s"] == 5
        first = await research.post("/v1/jobs", json={**job, "user": "bob"})
        assert first.status_code == 201
        capped = await research.post("/v1/jobs", json={**job, "user": "bob"})
        assert capped.status_code == 429, capped.text
        assert "user 'bob'" in capped.json()["message"]
    # the admin token may use every class
    assert (
        await served.admin.post("/v1/jobs", json={**job, "priority": "surge"})
    ).status_code == 201


async def test_the_next_cycle_schedules_by_the_applied_policy(world: World) -> None:
    policy, admin = world.plane.policy, Principal("tok_a", TokenKind.ADMIN, "admin")
    await world.agent("n1", gpus=3)  # room for all three: only the team's cap holds one back
    await policy.apply(admin, SURGE)
    ops = Principal("tok_o", TokenKind.TEAM, "ops", team="ops")
    research = Principal("tok_r", TokenKind.TEAM, "research", team="research")
    low = await world.submit(research, resources={"gpus": 1}, user="ana", priority="free")
    capped = await world.submit(research, resources={"gpus": 1}, user="ana", priority="free")
    high = await world.submit(ops, resources={"gpus": 1}, priority="surge")
    applied = await world.cycle()
    placed = {w.job_id for p in applied.placed for w in p.jobs}
    # surge (rank 50) first; research holds at most one GPU (its max_running_gpus)
    assert high.job.id in placed
    assert len(placed & {low.job.id, capped.job.id}) == 1
    reasons = world.plane.schedule.unplaced
    left = low.job.id if capped.job.id in placed else capped.job.id
    assert left in reasons


@pytest.mark.postgres
async def test_a_policy_applied_on_one_replica_rules_the_other(pg_url: str, tmp_path: Path) -> None:
    one = await World.open(pg_url, tmp_path / "one")
    two = await World.open(pg_url, tmp_path / "two")
    try:
        admin = Principal("tok_a", TokenKind.ADMIN, "admin")
        ops = Principal("tok_o", TokenKind.TEAM, "ops", team="ops")
        await two.submit(ops, resources={"gpus": 1}, priority="interactive")  # before: open
        await one.plane.policy.apply(admin, SURGE)
        two.clock.advance(REFRESH_S)  # the other replica's copy is now old enough to re-read
        rec = await two.submit(ops, resources={"gpus": 1}, priority="surge")
        assert rec.job.priority == "surge"
        await two.agent("n1", gpus=1)
        applied = await two.cycle()
        assert [w.job_id for p in applied.placed for w in p.jobs] == [rec.job.id]
        assert two.plane.rt.policy_version == 1
    finally:
        await two.close()
        await one.close()


ACROSS = """\
format: 1
classes:
  - {name: surge, rank: 50, preempt_other_teams: true}
  - {name: paid, rank: 30, may_preempt: true}
  - {name: batch, rank: 10}
"""


@pytest.mark.parametrize(
    ("klass", "lab_quota", "want_evicted"),
    [
        pytest.param("surge", 0.0, 1, id="a surge takes borrowed capacity from another team"),
        pytest.param("surge", 2.0, 0, id="never below that team's guarantee"),
        pytest.param("paid", 0.0, 0, id="a class that may only preempt its own team"),
    ],
)
async def test_a_class_may_preempt_other_teams_borrowed_work(
    world: World, klass: str, lab_quota: float, want_evicted: int
) -> None:
    admin = Principal("tok_a", TokenKind.ADMIN, "admin")
    await world.plane.policy.apply(admin, ACROSS)
    await world.plane.nodes.put_team(admin, Team("lab", quota_gpus=lab_quota))
    agent = await world.agent("n1", gpus=2)
    for _ in range(2):
        await world.submit(resources={"gpus": 1}, team="lab", priority="batch")
    assert len((await world.cycle()).placed) == 2
    for _ in range(2):
        await agent.start(await agent.next_assignment())
    world.clock.advance(120)  # past the minimum run time before preemption
    await world.submit(resources={"gpus": 1}, team="ops", priority=klass)
    applied = await world.cycle()
    assert len(applied.preempted) == want_evicted


async def test_work_of_a_class_a_new_policy_drops_waits_until_the_class_is_back(
    world: World,
) -> None:
    admin = Principal("tok_a", TokenKind.ADMIN, "admin")
    queued = await world.submit(resources={"gpus": 1}, priority="batch")
    await world.plane.policy.apply(admin, ACROSS.replace("  - {name: batch, rank: 10}\n", ""))
    await world.agent("n1", gpus=1)
    assert (await world.cycle()).placed == []
    reasons = world.plane.schedule.unplaced[queued.job.id].reasons
    assert "batch" in reasons[0].message
    await world.plane.policy.rollback(admin, 0)
    assert [w.job_id for p in (await world.cycle()).placed for w in p.jobs] == [queued.job.id]


CAPPED_USER = """\
format: 1
classes:
  - {name: paid, rank: 30}
  - {name: free, rank: 20}
users:
  ana: {max_running_gpus: 2}
"""


async def test_a_user_holds_no_more_running_gpus_than_the_policy_caps(world: World) -> None:
    admin = Principal("tok_a", TokenKind.ADMIN, "admin")
    await world.plane.policy.apply(admin, CAPPED_USER)
    agent = await world.agent("n1", gpus=4)
    old = await world.submit(resources={"gpus": 1}, user="ana")
    urgent = await world.submit(resources={"gpus": 1}, user="ana", priority="paid")
    later = await world.submit(resources={"gpus": 1}, user="ana")
    other = await world.submit(resources={"gpus": 1}, user="bo")
    placed = {w.job_id for p in (await world.cycle()).placed for w in p.jobs}
    # the cap lets two of ana's in, highest class then oldest; bo is not capped
    assert placed == {urgent.job.id, old.job.id, other.job.id}
    reason = world.plane.schedule.unplaced[later.job.id].reasons[0]
    assert reason.code.value == "quota_exceeded"
    assert "user ana holds its cap of 2 running GPUs" in reason.message
    assert (await world.cycle()).placed == []  # still capped, though a GPU is free
    running = {a.jobs[0].job_id: a for a in [await agent.next_assignment() for _ in range(3)]}
    await agent.finish(running[old.job.id])
    assert [w.job_id for p in (await world.cycle()).placed for w in p.jobs] == [later.job.id]
