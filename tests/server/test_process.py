"""``corral server`` as a real process over real HTTP, on SQLite and PostgreSQL.

* durability: every job answered with 201 is there after ``kill -9`` and a restart;
* the authorization matrix: each token kind against each endpoint;
* the command line: ``--help``, the banner, a bad ``--db``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from process_harness import ServerProcess, corral_command

pytestmark = pytest.mark.slow


def client(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=10)


def test_accepted_jobs_survive_kill_9_and_restart(db_url: str, tmp_path: Path) -> None:
    first = ServerProcess(db_url, tmp_path).start()
    try:
        assert first.admin_token, "the first start must print the admin token"
        assert any("database:" in line for line in first.output)
        with client(first.url, first.admin_token) as c:
            accepted = []
            for i in range(20):
                r = c.post("/v1/jobs", json={"kind": "sample", "payload": {"i": i}})
                assert r.status_code == 201
                accepted.append(r.json()["id"])
            r = c.post("/v1/jobs/batch", json={"jobs": [{"payload": {"b": i}} for i in range(10)]})
            assert r.status_code == 201
            accepted += [j["id"] for j in r.json()["jobs"]]
        first.kill9()  # straight after the last 201: no shutdown, no flush
    finally:
        first.stop()

    second = ServerProcess(db_url, tmp_path).start()
    try:
        assert second.admin_token is None, "the admin token is printed once, at the first start"
        with client(second.url, first.admin_token) as c:  # the old token still works
            for job_id in accepted:
                r = c.get(f"/v1/jobs/{job_id}")
                assert r.status_code == 200
                assert r.json()["state"] == "queued"
            assert len(c.get("/v1/jobs", params={"limit": 100}).json()["jobs"]) == 30
    finally:
        second.stop()


OK, CREATED, GONE, NOPE, FORBIDDEN, MISSING, CONFLICT = 200, 201, 204, 401, 403, 404, 409


def _matrix(a_job: str, b_job: str) -> list[tuple[str, str, dict[str, Any] | None, dict[str, int]]]:
    """(method, path, body, {token kind: status}); "team" is a token of team a."""

    def row(admin: int, team: int) -> dict[str, int]:
        return {"admin": admin, "team": team, "agent": FORBIDDEN, "none": NOPE, "bogus": NOPE}

    return [
        ("GET", "/v1/jobs", None, row(OK, OK)),
        ("POST", "/v1/jobs", {"kind": "sample"}, row(CREATED, CREATED)),
        ("POST", "/v1/jobs", {"team": "mx-b"}, row(CREATED, FORBIDDEN)),
        ("POST", "/v1/jobs/batch", {"jobs": [{}]}, row(CREATED, CREATED)),
        ("GET", f"/v1/jobs/{a_job}", None, row(OK, OK)),
        ("GET", f"/v1/jobs/{b_job}", None, row(OK, MISSING)),
        ("GET", f"/v1/jobs/{a_job}/result", None, row(OK, OK)),
        ("GET", f"/v1/jobs/{b_job}/result", None, row(OK, MISSING)),
        ("GET", f"/v1/jobs/{b_job}/events", None, row(OK, MISSING)),
        ("POST", f"/v1/jobs/{b_job}/cancel", None, row(OK, MISSING)),
        ("POST", f"/v1/jobs/{b_job}/interrupt", None, row(OK, MISSING)),
        ("PATCH", f"/v1/jobs/{a_job}", {"hold": False}, row(OK, OK)),
        ("PATCH", f"/v1/jobs/{b_job}", {"hold": True}, row(CONFLICT, MISSING)),  # cancelled
        ("GET", f"/v1/jobs/{a_job}/deliveries", None, row(OK, OK)),
        ("GET", f"/v1/jobs/{b_job}/deliveries", None, row(OK, MISSING)),
        ("GET", "/v1/webhooks/secret", None, row(OK, OK)),
        ("GET", "/v1/webhooks/secret?team=mx-b", None, row(OK, FORBIDDEN)),
        ("POST", "/v1/webhooks/secret/rotate?team=mx-b", None, row(OK, FORBIDDEN)),
        ("GET", "/v1/nodes", None, row(OK, OK)),
        ("GET", "/v1/nodes/gpu-x", None, row(MISSING, MISSING)),
        ("POST", "/v1/nodes/gpu-x/pause", None, row(MISSING, FORBIDDEN)),
        ("POST", "/v1/nodes/gpu-x/resume", None, row(MISSING, FORBIDDEN)),
        ("POST", "/v1/nodes/gpu-x/drain", None, row(MISSING, FORBIDDEN)),
        ("GET", "/v1/autoscaler", None, row(OK, FORBIDDEN)),
        ("GET", "/v1/teams", None, row(OK, OK)),
        ("PUT", "/v1/teams/mx-b", {"quota_gpus": 1}, row(OK, FORBIDDEN)),
        ("GET", "/v1/queue", None, row(OK, OK)),
        ("GET", "/v1/tokens", None, row(OK, FORBIDDEN)),
        ("POST", "/v1/tokens", {"kind": "agent", "name": "x"}, row(CREATED, FORBIDDEN)),
        ("DELETE", "/v1/tokens/tok_nope", None, row(MISSING, FORBIDDEN)),
        ("GET", "/v1/events/export", None, row(OK, FORBIDDEN)),
        ("GET", "/v1/events", None, row(OK, OK)),
        ("GET", "/healthz", None, dict.fromkeys(("admin", "team", "agent", "none", "bogus"), OK)),
        ("GET", "/metrics", None, dict.fromkeys(("admin", "team", "agent", "none", "bogus"), OK)),
        # last: deleting b_job (cancelled, so finished) leaves nothing for the rows above
        ("DELETE", f"/v1/jobs/{a_job}", None, row(CONFLICT, CONFLICT)),  # queued: cancel first
        ("DELETE", f"/v1/jobs/{b_job}", None, row(GONE, MISSING)),
    ]


def _status(c: httpx.Client, method: str, path: str, body: dict[str, Any] | None) -> int:
    with c.stream(method, path, json=body) as r:  # SSE endpoints: the status is all we need
        return r.status_code


def test_authorization_matrix(live_server: ServerProcess) -> None:
    server = live_server
    with client(server.url, server.admin_token) as admin:
        new = {"kind": "team", "name": "mx-ci", "team": "mx-a"}
        team_token = admin.post("/v1/tokens", json=new).json()["token"]
        new = {"kind": "agent", "name": "mx-gpu-box"}
        agent_token = admin.post("/v1/tokens", json=new).json()["token"]
        a_job = admin.post("/v1/jobs", json={"team": "mx-a"}).json()["id"]
        b_job = admin.post("/v1/jobs", json={"team": "mx-b"}).json()["id"]
        admin.post(f"/v1/jobs/{b_job}/cancel")  # so its event stream ends
    tokens = {
        "admin": server.admin_token,
        "team": team_token,
        "agent": agent_token,
        "none": None,
        "bogus": "corral_admin_forged",
    }
    clients = {kind: client(server.url, token) for kind, token in tokens.items()}
    failures = []
    try:
        for method, path, body, want in _matrix(a_job, b_job):
            for kind, c in clients.items():
                got = _status(c, method, path, body)
                if got != want[kind]:
                    failures.append(f"{kind:6} {method} {path}: want {want[kind]}, got {got}")
    finally:
        for c in clients.values():
            c.close()
    assert not failures, "\n".join(failures)


def test_messages_say_what_is_wrong_and_team_tokens_see_only_their_team(
    live_server: ServerProcess,
) -> None:
    server = live_server
    with client(server.url, server.admin_token) as admin:
        new = {"kind": "team", "name": "msg", "team": "msg-a"}
        team_token = admin.post("/v1/tokens", json=new).json()["token"]
        agent = admin.post("/v1/tokens", json={"kind": "agent", "name": "msg-box"}).json()
        admin.post("/v1/jobs", json={"team": "msg-b"})
    with client(server.url, None) as anon:
        r = anon.get("/v1/jobs")
        assert r.status_code == 401
        assert "Authorization: Bearer" in r.json()["message"]
        assert r.headers["WWW-Authenticate"] == "Bearer"
    with client(server.url, agent["token"]) as c:
        assert "agent join token" in c.get("/v1/jobs").json()["message"]
    with client(server.url, team_token) as team:
        mine = team.post("/v1/jobs", json={}).json()
        assert mine["team"] == "msg-a"
        assert [j["id"] for j in team.get("/v1/jobs").json()["jobs"]] == [mine["id"]]
        assert [e["job"]["id"] for e in team.get("/v1/queue").json()["entries"]] == [mine["id"]]
        r = team.get("/v1/jobs", params={"team": "msg-b"})
        assert r.status_code == 403
        assert "team 'msg-a'" in r.json()["message"]
        assert "admin token" in team.put("/v1/teams/msg-a", json={}).json()["message"]
    with client(server.url, server.admin_token) as admin:
        assert admin.delete(f"/v1/tokens/{agent['id']}").status_code == 204
    with client(server.url, agent["token"]) as c:
        assert c.get("/v1/jobs").json()["message"] == "this token was revoked"


def test_server_help_explains_the_options() -> None:
    out = subprocess.run(
        [*corral_command(), "server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "120", "PATH": ""},
    )
    assert out.returncode == 0
    for needle in ("--db", "postgresql://", "--port", "--node-timeout", "admin token"):
        assert needle in out.stdout


def test_a_bad_db_url_is_refused_clearly(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli.main import app

    out = CliRunner().invoke(app, ["server", "--db", "mysql://x/y", "--home", str(tmp_path)])
    assert out.exit_code == 2
    assert "unsupported database 'mysql'" in out.output
