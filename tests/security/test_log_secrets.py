"""No secret in any log line (issue 45, item 9).

A real ``corral server`` at log level info (and debug, which adds uvicorn's
access log) is sent every way a token travels: Bearer on the API and its event
streams, the dashboard's login and session cookie, HTTP Basic and ``?token=``
on the drop-in APIs, ``?token=`` on the ComfyUI websocket (accepted and
refused), agent join tokens over gRPC (good and bad), and tokens the server
does not know. Then its whole output is searched
for every one of those secrets: none may appear, and a refused websocket is no
ERROR.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import websockets
from process_harness import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
from raw_agent import RawAgent  # the e2e tests' hand-driven agent

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ADMIN = "corral_admin_log-test-admin-secret-0123456789"
UNKNOWN = ["corral_team_never-issued-secret-abcdef", "plain-wrong-secret-5f3c9a"]


@pytest.fixture(params=["info", "debug"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    level = ("--log-level", request.param)  # after the harness's own: the last one counts
    env = {"CORRAL_ADMIN_TOKEN": ADMIN}
    proc = ServerProcess(str(tmp_path / "corral.db"), tmp_path, *level, env=env).start()
    try:
        yield proc
    finally:
        proc.stop()


async def test_no_token_appears_in_the_server_output(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        team = await _new_token(http, admin, {"kind": "team", "name": "t", "team": "red"})
        agent = await _new_token(http, admin, {"kind": "agent", "name": "a"})
        secrets = [ADMIN, team, agent, *UNKNOWN]
        await _bearer_and_streams(http, team)
        await _drop_in_apis(http, team)
        await _websockets(server.url, team)
        await _agents(_agent_address(server), agent)
    server.stop()
    output = _logged(server)
    leaked = [s for s in secrets if s in output]
    assert not leaked, f"secrets in the server output: {leaked}\n{output}"
    assert "[redacted]" in output  # the websocket lines were logged, with their token masked
    assert "ERROR" not in output, output
    assert "Traceback" not in output, output


async def _new_token(http: httpx.AsyncClient, admin: dict[str, str], body: dict[str, str]) -> str:
    reply = await http.post("/v1/tokens", json=body, headers=admin)
    assert reply.status_code == 201, reply.text
    return str(reply.json()["token"])


async def _bearer_and_streams(http: httpx.AsyncClient, team: str) -> None:
    """Bearer on plain routes and on both event streams; unknown tokens too."""
    bearer = {"Authorization": f"Bearer {team}"}
    job = (await http.post("/v1/jobs", json={"payload": {}}, headers=bearer)).json()["id"]
    assert (await http.post(f"/v1/jobs/{job}/cancel", headers=bearer)).status_code == 200
    async with http.stream("GET", f"/v1/jobs/{job}/events", headers=bearer) as stream:
        assert stream.status_code == 200
        await stream.aread()  # the job has ended: its stream ends
    async with http.stream("GET", "/v1/events", headers=bearer) as stream:
        assert stream.status_code == 200
    csrf = {"X-Corral-CSRF": "1"}
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=10) as browser:
        login = await browser.post("/v1/session", json={"token": team}, headers=csrf)
        assert login.status_code == 200  # the dashboard's login: a cookie from here on
        assert (await browser.get("/v1/queue")).status_code == 200
        assert (await browser.post("/v1/jobs", json={"payload": {}}, headers=csrf)).is_success
    for wrong in UNKNOWN:
        reply = await http.post("/v1/session", json={"token": wrong}, headers=csrf)
        assert reply.status_code == 401
        reply = await http.get("/v1/queue", headers={"Authorization": f"Bearer {wrong}"})
        assert reply.status_code == 401
        assert (await http.get("/v1/events", params={"token": wrong})).status_code == 401


async def _drop_in_apis(http: httpx.AsyncClient, team: str) -> None:
    """HTTP Basic (the token as password) and ``?token=`` on the drop-in APIs."""
    for secret, want in ((team, 200), *((w, 401) for w in UNKNOWN)):
        basic = base64.b64encode(f"alice:{secret}".encode()).decode()
        reply = await http.get("/sdapi/v1/options", headers={"Authorization": f"Basic {basic}"})
        assert reply.status_code in (want, 503), reply.text  # 503: no backend connected
        reply = await http.get("/queue", params={"token": secret})
        assert reply.status_code == want, reply.text


async def _websockets(url: str, team: str) -> None:
    """ComfyUI's ``/ws?token=``: accepted with the team token, refused with unknown ones."""
    base = url.replace("http://", "ws://")
    async with websockets.connect(f"{base}/ws?clientId=c1&token={team}") as ws:
        assert "status" in str(await asyncio.wait_for(ws.recv(), 10))
    basic = base64.b64encode(f"bob:{team}".encode()).decode()
    headers = {"Authorization": f"Basic {basic}"}
    async with websockets.connect(f"{base}/ws?clientId=c3", additional_headers=headers) as ws:
        assert "status" in str(await asyncio.wait_for(ws.recv(), 10))
    for wrong in UNKNOWN:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"{base}/ws?clientId=c2&token={wrong}"):
                pass
        assert refused.value.response.status_code == 401


async def _agents(address: str, agent: str) -> None:
    """An agent joins with its token; agents with unknown tokens are refused."""
    joined = RawAgent(address, agent, node="log-test")
    await joined.connect()
    await joined.close()
    for wrong in UNKNOWN:
        refused = RawAgent(address, wrong)
        with pytest.raises(grpc.aio.AioRpcError):
            await refused.knock()
        await refused.close()


def _agent_address(proc: ServerProcess) -> str:
    line = next(line for line in proc.output if "agents join with:" in line)
    return line.split("--server ", 1)[1].split()[0]


def _logged(proc: ServerProcess) -> str:
    """Everything the (stopped) server printed."""
    lines = list(proc.output)
    while not proc.lines.empty():
        lines.append(proc.lines.get_nowait())
    return "\n".join(lines)
