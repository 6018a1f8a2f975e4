"""Attacks on the node registry (issue 45, item 13).

An agent token could mint node names without end (each hello under a new name made a
row that nothing could delete), and a team token read other teams' job ids off
``GET /v1/nodes``. Now a join token holds at most ``agents.max_nodes_per_token`` names
(a new one replaces the token's longest-lost node, and is refused while all are live),
the admin deletes a node that is gone (``DELETE /v1/nodes/{name}``; 409 while it is not
lost), and a team token sees other teams' allocations without their job ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from http_harness import ADMIN_TOKEN, Served, eventually, serve
from process_harness import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from raw_agent import RawAgent

pytestmark = pytest.mark.anyio

CAP = 3
BEAT_S = 0.1  # heartbeats of the agents that stay, well inside the node timeout below
GRPC_SETTLE_S = 0.2  # see test_uploads._connected


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A real ``corral server`` whose join tokens hold 3 node names; silent nodes are lost
    after a second."""
    env = {
        "CORRAL_ADMIN_TOKEN": ADMIN_TOKEN,
        "CORRAL_AGENTS__MAX_NODES_PER_TOKEN": str(CAP),
        "CORRAL_SCHEDULING__NODE_TIMEOUT_S": "1",
        "CORRAL_SCHEDULING__LIVENESS_TICK_S": "0.1",
    }
    process = ServerProcess(db_url, tmp_path / "home", env=env).start()
    try:
        yield process
    finally:
        process.stop()


async def test_a_join_token_holds_a_bounded_number_of_node_names_and_gone_ones_go(
    server: ServerProcess,
) -> None:
    found = re.search(r"--server (grpc://\S+)", "\n".join(server.output))
    assert found is not None, server.output
    admin = httpx.AsyncClient(base_url=server.url, headers=_bearer(ADMIN_TOKEN))
    async with admin, _agents() as agents:
        fleet, other = await _token(admin, "agent", "fleet"), await _token(admin, "agent", "b")
        team = await _token(admin, "team", "t", team="t1")

        def agent(name: str, token: str = fleet) -> RawAgent:
            agents[name] = RawAgent(found.group(1), token, node=name, key=name * 32)
            return agents[name]

        for name in ("aa", "bb", "cc"):
            await agent(name).connect()
        beating = asyncio.create_task(_beat(agents, "aa", "bb", "cc"))
        try:
            refused = await _refused(agent("dd").connect())
            assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "agents.max_nodes_per_token" in (refused.details() or "")
            ready = await admin.delete("/v1/nodes/bb")
            assert ready.status_code == 409, ready.text
            assert "lost" in ready.json()["message"]
            by_team = await admin.delete("/v1/nodes/bb", headers=_bearer(team))
            assert by_team.status_code == 403
            await agent("ee", other).connect()  # another token: a cap of its own

            beating.cancel()
            beating = asyncio.create_task(_beat(agents, "bb", "cc", "ee"))
            await agents["aa"].close()
            await eventually(lambda: _state(admin, "aa", "lost"))
            await agent("dd").connect()  # takes the place of the longest-lost name
            assert (await admin.get("/v1/nodes/aa")).status_code == 404

            beating.cancel()
            beating = asyncio.create_task(_beat(agents, "bb", "dd", "ee"))
            await agents["cc"].close()
            await eventually(lambda: _state(admin, "cc", "lost"))
            assert (await admin.delete("/v1/nodes/cc")).status_code == 204
            assert (await admin.get("/v1/nodes/cc")).status_code == 404
            assert (await admin.delete("/v1/nodes/cc")).status_code == 404
            names = {n["name"] for n in (await admin.get("/v1/nodes")).json()}
            assert names == {"bb", "dd", "ee"}
        finally:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)


async def test_a_team_token_sees_other_teams_allocations_without_their_job_ids(
    db_url: str, tmp_path: Path
) -> None:
    async with serve(db_url, tmp_path / "home") as served:
        tokens = {t: await _token(served.admin, "team", t, team=t) for t in ("t1", "t2")}
        jobs = {t: await _submit(served, tokens[t]) for t in ("t1", "t2")}
        await served.agent("n1", gpus=2)
        await eventually(lambda: _holds(served, "n1", 2))
        for team, token in tokens.items():
            async with served.client(token) as http:
                for view in await _views(http, "n1"):
                    seen = {j for a in view["allocations"] for j in a["job_ids"]}
                    assert seen == {jobs[team]}, (team, view)
        for view in await _views(served.admin, "n1"):
            assert {j for a in view["allocations"] for j in a["job_ids"]} == set(jobs.values())


async def _views(http: httpx.AsyncClient, name: str) -> list[dict[str, object]]:
    """Node ``name`` as ``GET /v1/nodes/{name}`` and ``GET /v1/nodes`` show it."""
    one = (await http.get(f"/v1/nodes/{name}")).json()
    listed = [n for n in (await http.get("/v1/nodes")).json() if n["name"] == name]
    return [one, *listed]


async def _holds(served: Served, name: str, count: int) -> bool:
    node = (await served.admin.get(f"/v1/nodes/{name}")).json()
    return len(node["allocations"]) == count


async def _submit(served: Served, token: str) -> str:
    async with served.client(token) as http:
        reply = await http.post("/v1/jobs", json={"resources": {"gpus": 1}})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["id"])


async def _token(admin: httpx.AsyncClient, kind: str, name: str, team: str | None = None) -> str:
    body = {"kind": kind, "name": name} | ({"team": team} if team else {})
    reply = await admin.post("/v1/tokens", json=body)
    assert reply.status_code == 201, reply.text
    return str(reply.json()["token"])


async def _state(admin: httpx.AsyncClient, name: str, state: str) -> bool:
    reply = await admin.get(f"/v1/nodes/{name}")
    return reply.status_code == 200 and reply.json()["state"] == state


async def _beat(agents: dict[str, RawAgent], *names: str) -> None:
    while True:
        for name in names:
            await agents[name].beat()
        await asyncio.sleep(BEAT_S)


@contextlib.asynccontextmanager
async def _agents() -> AsyncIterator[dict[str, RawAgent]]:
    agents: dict[str, RawAgent] = {}
    try:
        yield agents
    finally:
        for agent in agents.values():
            await agent.close()
        await asyncio.sleep(GRPC_SETTLE_S)


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
