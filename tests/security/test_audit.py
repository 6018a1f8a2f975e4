"""The audit log: who did what, when and from where, and no team can erase it (item 12).

The attack: a leaked team token (or an insider holding one) cancels and deletes
work, an admin token changes quotas and tokens, and afterwards nothing says
who did it. Before the fix nothing was recorded, and a team's
``DELETE /v1/jobs/{id}`` erased the job's own ``job.cancelled`` event. Here a
real server (uvicorn on loopback, SQLite and PostgreSQL) takes every recorded
action over HTTP and ``GET /v1/audit`` must show each with its actor, target
and address; a team token is refused the log (and its attempt recorded, a
bounded number of times); deleting a job leaves its records; records cannot be
updated even with the database in hand; the retention sweep removes them only
after ``retention.audit_s``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from http_harness import Served, serve
from server_harness import ADMIN, World

from corral.core.model import Team
from corral.server.services.audit import DENIALS_PER_MINUTE
from corral.server.store.audit import AuditFilter
from corral.server.store.tables import audit

pytestmark = pytest.mark.anyio
DAY = 86400.0
NEVER_FITS = {"resources": {"gpus": 64}}  # stays queued: no agent has 64 GPUs


async def _token(s: Served, kind: str, name: str, team: str | None = None) -> dict[str, Any]:
    r = await s.admin.post("/v1/tokens", json={"kind": kind, "name": name, "team": team})
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return dict(response.json()) if response.content else {}


async def _records(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    """Every record matching ``params``, oldest first, read page by page."""
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"limit": 500, **params, "cursor": cursor}
        page = await _ok(await client.get("/v1/audit", params=_no_none(query)))
        out += page["records"]
        cursor = page["next_cursor"]
        if cursor is None:
            return out[::-1]


def _no_none(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def _seen(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(action, target, actor name) of the records tokens made (not the server's own)."""
    return [(r["action"], r["target"], r["actor"]["name"]) for r in records if r["actor"]["id"]]


async def _cancel_and_delete(team: httpx.AsyncClient) -> str:
    job = await _ok(await team.post("/v1/jobs", json=NEVER_FITS), 201)
    await _ok(await team.post(f"/v1/jobs/{job['id']}/cancel"))
    assert (await team.delete(f"/v1/jobs/{job['id']}")).status_code == 204
    return str(job["id"])


async def test_every_admin_action_is_recorded_with_its_actor_target_and_address(
    db_url: str, tmp_path: Path
) -> None:
    async with serve(db_url, tmp_path) as s:
        await s.agent("n1")
        ci = await _token(s, "team", "ci", "vision")
        rack = await _token(s, "agent", "rack")
        await _ok(await s.admin.put("/v1/teams/vision", json={"quota_gpus": 2, "weight": 3}))
        model = {"sources": ["upload"], "size": 1, "sha256": "a" * 64}
        await _ok(await s.admin.put("/v1/models/m1", json=model), 201)
        assert (await s.admin.delete("/v1/models/m1")).status_code == 204
        for verb in ("pause", "drain", "resume"):
            await _ok(await s.admin.post(f"/v1/nodes/n1/{verb}"))
        async with s.client(ci["token"]) as team:
            job_id = await _cancel_and_delete(team)
            queued = await _ok(await team.post("/v1/jobs", json=NEVER_FITS), 201)
            await _ok(await team.post(f"/v1/jobs/{queued['id']}/interrupt"))
        assert (await s.admin.delete(f"/v1/tokens/{rack['id']}")).status_code == 204

        records = await _records(s.admin)

    assert _seen(records) == [
        ("token.create", ci["id"], "admin"),
        ("token.create", rack["id"], "admin"),
        ("team.set", "vision", "admin"),
        ("model.put", "m1", "admin"),
        ("model.delete", "m1", "admin"),
        ("node.pause", "n1", "admin"),
        ("node.drain", "n1", "admin"),
        ("node.resume", "n1", "admin"),
        ("job.cancel", job_id, "ci"),
        ("job.delete", job_id, "ci"),
        ("job.interrupt", queued["id"], "ci"),
        ("token.revoke", rack["id"], "admin"),
    ]
    first = records[0]
    assert first["actor"] == {"id": None, "kind": "server", "name": "server", "team": None}
    assert (first["action"], first["detail"]) == (
        "token.create",
        {"kind": "admin", "configured": True},
    ), "the configured admin token was registered at start by the server itself"
    by_action = {r["action"]: r for r in records}
    cancel = by_action["job.cancel"]
    assert cancel["actor"] == {"id": ci["id"], "kind": "team", "name": "ci", "team": "vision"}
    assert cancel["detail"] == {"team": "vision", "state": "queued"}
    assert by_action["token.create"]["detail"] == {"kind": "agent", "name": "rack", "team": None}
    quota = by_action["team.set"]["detail"]
    assert (quota["quota_gpus"], quota["weight"], quota["before"]["quota_gpus"]) == (2, 3, 0)
    assert by_action["model.put"]["detail"]["sources"] == ["upload"]
    assert all(r["address"] == "127.0.0.1" for r in records if r["actor"]["id"])
    assert all(r["forwarded_for"] is None for r in records)
    times = [r["at"] for r in records]
    assert times == sorted(times)


async def test_the_log_filters_by_actor_action_target_and_time_and_pages(
    db_url: str, tmp_path: Path
) -> None:
    async with serve(db_url, tmp_path) as s:
        ci = await _token(s, "team", "ci", "vision")
        ops = await _token(s, "team", "ops", "infra")
        async with s.client(ci["token"]) as team:
            deleted = [await _cancel_and_delete(team) for _ in range(3)]
        async with s.client(ops["token"]) as team:
            await _cancel_and_delete(team)
        everything = await _records(s.admin)
        mid = everything[len(everything) // 2]["at"]

        by_ci = await _records(s.admin, actor="ci")
        by_id = await _records(s.admin, actor=ci["id"])
        deletes = await _records(s.admin, action="job.delete")
        job_actions = await _records(s.admin, action="job.*", team="vision")
        one_job = await _records(s.admin, target=deleted[0])
        before = await _records(s.admin, until=mid)
        after = await _records(s.admin, since=mid)
        paged = await _records(s.admin, limit=2)

    assert by_ci == by_id
    assert [r["action"] for r in by_ci] == ["job.cancel", "job.delete"] * 3
    assert len(deletes) == 4
    assert [r["target"] for r in job_actions] == [j for j in deleted for _ in range(2)]
    assert [r["action"] for r in one_job] == ["job.cancel", "job.delete"]
    assert before + after == everything
    assert paged == everything, "pages of 2 walk the whole log, none twice"


async def test_a_team_token_is_refused_the_log_and_its_attempts_are_recorded_boundedly(
    db_url: str, tmp_path: Path
) -> None:
    async with serve(db_url, tmp_path) as s:
        ci = await _token(s, "team", "ci", "vision")
        async with s.client(ci["token"]) as team:
            refused = await team.get("/v1/audit")
            assert refused.status_code == 403
            assert "admin" in refused.json()["message"]
            for i in range(3 * DENIALS_PER_MINUTE):
                r = await team.post(
                    "/v1/tokens", json={"kind": "team", "name": f"x{i}", "team": "x"}
                )
                assert r.status_code == 403
        async with s.client(None) as anonymous:
            assert (await anonymous.get("/v1/audit")).status_code == 401
        denied = await _records(s.admin, action="auth.denied")

    assert len(denied) == DENIALS_PER_MINUTE, "a token's refusals are recorded, but few a minute"
    assert denied[0]["target"] == "GET /v1/audit"
    assert denied[0]["actor"]["id"] == ci["id"]
    assert "read the audit log" in denied[0]["detail"]["reason"]
    assert {r["target"] for r in denied[1:]} == {"POST /v1/tokens"}


async def test_a_team_deleting_its_job_cannot_erase_the_record(db_url: str, tmp_path: Path) -> None:
    async with serve(db_url, tmp_path) as s:
        ci = await _token(s, "team", "ci", "vision")
        async with s.client(ci["token"]) as team:
            job_id = await _cancel_and_delete(team)
            assert (await team.get(f"/v1/jobs/{job_id}")).status_code == 404
            for method in ("DELETE", "PUT", "PATCH", "POST"):
                r = await team.request(method, "/v1/audit")
                assert r.status_code == 405, f"{method} /v1/audit: {r.status_code}"
            assert (await team.delete("/v1/audit/1")).status_code == 404
        gone = await s.admin.get(f"/v1/jobs/{job_id}")
        kept = await _records(s.admin, target=job_id)

        with pytest.raises(sa.exc.DBAPIError, match="append-only"):  # not even with the DB
            async with s.plane.rt.db.write() as conn:
                await conn.execute(sa.update(audit).values(actor_name="someone else"))
        unchanged = await _records(s.admin, target=job_id)

    assert gone.status_code == 404, "the job and its events are gone"
    assert [(r["action"], r["actor"]["name"]) for r in kept] == [
        ("job.cancel", "ci"),
        ("job.delete", "ci"),
    ]
    assert unchanged == kept


async def test_retention_sweeps_records_older_than_audit_s(db_url: str, tmp_path: Path) -> None:
    world = await World.open(db_url, tmp_path)
    try:
        nodes, audit_s = world.plane.nodes, world.plane.rt.settings.retention.audit_s
        await nodes.put_team(ADMIN, Team("old"))
        world.clock.advance(audit_s / 2)
        await nodes.put_team(ADMIN, Team("recent"))
        world.clock.advance(audit_s / 2 - 1)
        assert not (await world.plane.retention.sweep()).audit, "a year has not passed"

        world.clock.advance(2)
        report = await world.plane.retention.sweep()
        page = await world.plane.audit.page(ADMIN, AuditFilter(), None, 100)
    finally:
        await world.close()

    assert report.audit == 2, "the first start's admin token record and the old team's"
    assert [(r.action, r.target) for r in page.records] == [("team.set", "recent")]


@pytest.mark.parametrize(
    ("trusted", "want_address"),
    [("127.0.0.1", "203.0.113.7"), ("192.0.2.1", "127.0.0.1")],
    ids=["behind-a-trusted-proxy", "forwarded-for-from-anyone-else"],
)
async def test_the_address_and_forwarded_for_are_recorded_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trusted: str, want_address: str
) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", trusted)  # uvicorn's trusted proxies
    async with serve(str(tmp_path / "c.db"), tmp_path) as s:
        headers = {"X-Forwarded-For": "203.0.113.7"}
        await _ok(await s.admin.put("/v1/teams/t", json={"quota_gpus": 1}, headers=headers))
        (record,) = await _records(s.admin, action="team.set")

    assert (record["address"], record["forwarded_for"]) == (want_address, "203.0.113.7")
