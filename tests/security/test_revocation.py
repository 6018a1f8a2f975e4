"""Revoking a token ends every stream and connection it holds open, on every replica.

The attack: a leaked agent or team token is revoked, but what it already
opened lives on. Before the fix a revoked agent token's agent stayed
connected and ran new work, a revoked team token's SSE stream kept
delivering, and another replica trusted its cached principal for
``api.token_cache_s``. Here real servers (``corral server`` processes, one on
SQLite and two replicas on one PostgreSQL) meet a real ``corral agent`` over
gRPC and real SSE clients; every "within a second" is a wait on the effect
with a generous deadline. The last tests drive two in-process replicas through
public service methods: a lost note, and a request authenticated just before
the revocation.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from e2e_harness import ADMIN, CLI, Cluster, Proc, eventually, job, submit, wait_state
from process_harness import ServerProcess
from revocation_harness import DEADLINE_S, Follower, bearer, new_token, revoke

from corral.core.errors import Unauthenticated
from corral.server.api.schemas import JobIn
from corral.server.app import create_plane
from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal, TokenKind
from corral.server.services.compat import CompatJobs, caller_for
from corral.server.services.jobs import Draft, new_job_id
from corral.server.settings import Settings

pytestmark = pytest.mark.slow

LONG = {"steps": 400, "step_s": 0.05, "preview_every": 50}  # 20 s unless stopped
QUICK = {"steps": 3, "step_s": 0.01}
PG_BASE = "postgresql://postgres@127.0.0.1:5432/test"
ADMIN_PRINCIPAL = Principal("tok_admin", TokenKind.ADMIN, "admin")
REVOKED = r"(token tok_\w+|this token) was revoked"  # on the open stream, or at a redial


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """The end-to-end tests' processes; their output is printed when a test fails."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
        print(c.logs())


def test_a_revoked_agent_token_ends_the_agents_stream_and_its_work_moves(
    cluster: Cluster,
) -> None:
    cluster.start_server(node_timeout=120)  # only the revocation can make the node leave
    with cluster.client() as http:
        leaked = new_token(http, "agent", "leaked")
        agent = cluster.start_agent("leaked-box", "--cpus", "1", token=leaked["token"])
        running = submit(http, payload=LONG)["id"]
        assert wait_state(http, running, "running")["node"] == "leaked-box"

        revoke(http, leaked)
        assert agent.popen.wait(DEADLINE_S) == 3, "the agent stops for good, it does not redial"
        agent.wait_for(rf"refused this agent: agent token rejected: {REVOKED}")
        eventually(
            lambda: http.get("/v1/nodes/leaked-box").json()["state"] == "lost",
            DEADLINE_S,
            "the revoked agent's node left",
        )
        assert job(http, running)["state"] == "queued", "its work went back to the queue"
        http.post(f"/v1/jobs/{running}/cancel").raise_for_status()

        later = submit(http, payload=QUICK)["id"]
        fresh = new_token(http, "agent", "fresh")
        cluster.start_agent("fresh-box", "--cpus", "1", token=fresh["token"])
        assert wait_state(http, later, "succeeded", timeout=30)["node"] == "fresh-box"


def test_a_revoked_team_tokens_event_streams_end(cluster: Cluster) -> None:
    cluster.start_server()
    with cluster.client() as http:
        team = new_token(http, "team", "leaked", team="vision")
        with httpx.Client(base_url=cluster.http, headers=bearer(team["token"])) as client:
            queued = submit(client, payload=QUICK)["id"]  # no agent: it stays queued
        streams = [
            Follower(cluster.http, team["token"], "/v1/events?after=0"),
            Follower(cluster.http, team["token"], f"/v1/jobs/{queued}/events"),
        ]
        address = cluster.http.removeprefix("http://")
        with connect(f"ws://{address}/ws?clientId=x&token={team['token']}") as comfy:
            assert json.loads(comfy.recv(timeout=DEADLINE_S))["type"] == "status"
            revoke(http, team)
            for stream in streams:
                stream.wait_ended()
            with pytest.raises(ConnectionClosed):  # the drop-in ComfyUI API's websocket too
                comfy.recv(timeout=DEADLINE_S)
        again = httpx.get(f"{cluster.http}/v1/events", headers=bearer(team["token"]))
        assert again.status_code == 401
        assert again.json()["message"] == "this token was revoked"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A schema of its own in the test database, dropped afterwards."""
    if not _postgres_up():
        pytest.skip("PostgreSQL not running on 127.0.0.1:5432")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_BASE}?schema={schema}"
    asyncio.run(_drop(schema))


@pytest.mark.postgres
def test_a_revocation_on_one_replica_ends_streams_held_by_another(
    pg_url: str, tmp_path: Path
) -> None:
    env = {"CORRAL_ADMIN_TOKEN": ADMIN}
    deciding = ServerProcess(pg_url, tmp_path / "a", env=env).start()
    holding = ServerProcess(pg_url, tmp_path / "b", env=env).start()
    agent: Proc | None = None
    try:
        with httpx.Client(base_url=deciding.url, headers=bearer(ADMIN), timeout=10) as http:
            team = new_token(http, "team", "leaked", team="vision")
            leaked = new_token(http, "agent", "leaked")
            agent = _agent(holding, leaked["token"], tmp_path)
            agent.wait_for(r"connected to grpc://")
            with httpx.Client(base_url=holding.url, headers=bearer(team["token"])) as client:
                submit(client, payload=QUICK)  # an event for the stream to start with
            stream = Follower(holding.url, team["token"], "/v1/events?after=0")

            revoke(http, team)
            revoke(http, leaked)
            stream.wait_ended()
            assert agent.popen.wait(DEADLINE_S) == 3, agent.log()
            agent.wait_for(rf"agent token rejected: {REVOKED}")
    finally:
        if agent is not None:
            agent.stop()
        holding.stop()
        deciding.stop()


def _agent(server: ServerProcess, token: str, tmp: Path) -> Proc:
    address = next(m.group(1) for s in server.output if (m := re.search(r"(grpc://\S+)", s)))
    argv = [sys.executable, "-c", CLI, "agent", "--server", address, "--name", "held-box"]
    argv += ["--token", token, "--work-dir", str(tmp / "agent"), "--cpus", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return Proc("agent held-box", argv, env | {"PYTHONUNBUFFERED": "1"})


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_replica_that_missed_the_note_ends_the_stream_at_its_next_check(
    pg_url: str, tmp_path: Path
) -> None:
    async with _replicas(pg_url, tmp_path) as (deciding, holding):
        info, secret = await deciding.auth.create(TokenKind.TEAM, "leaked", "vision")
        who = await holding.auth.authenticate(secret)  # cached on the holding replica
        stream = holding.auth.sessions.guard(who.token_id, _forever())
        reading = asyncio.ensure_future(anext(stream, None))
        await _eventually(lambda: holding.auth.sessions.held(who.token_id) == 1)

        assert deciding.notifier is not None
        await deciding.notifier.close()  # the note is lost
        await deciding.auth.revoke(info.id)
        assert await holding.auth.sweep() == [info.id]  # what its watch loop runs each second
        assert await asyncio.wait_for(reading, DEADLINE_S) is None, "the stream ended"
        with pytest.raises(Unauthenticated, match="revoked"):
            await holding.auth.authenticate(secret)


@pytest.mark.anyio
@pytest.mark.postgres
async def test_a_request_authenticated_before_a_revocation_opens_no_stream_after_it(
    pg_url: str, tmp_path: Path
) -> None:
    async with _replicas(pg_url, tmp_path) as (deciding, holding):
        info, secret = await deciding.auth.create(TokenKind.TEAM, "leaked", "vision")
        who = await holding.auth.authenticate(secret)  # the request got this far, then ...
        await deciding.auth.revoke(info.id)  # ... the token is revoked on another replica
        await _eventually(lambda: holding.auth.sessions.is_revoked(info.id))  # the note
        with pytest.raises(Unauthenticated, match="revoked"):
            holding.auth.sessions.guard(who.token_id, _forever())
        with pytest.raises(Unauthenticated, match="revoked"):  # no cached principal trusted
            await holding.auth.authenticate(secret)


@pytest.mark.anyio
async def test_a_drop_in_call_waiting_for_its_job_is_answered_401_when_revoked(
    tmp_path: Path,
) -> None:
    """An AUTOMATIC1111 ``txt2img`` holds its request open until the job ends."""
    settings = Settings(home=tmp_path, store={"db": str(tmp_path / "corral.db")})  # type: ignore[arg-type]
    plane = create_plane(settings, run_loops=False)
    await plane.start()
    try:
        info, secret = await plane.auth.create(TokenKind.TEAM, "leaked", "vision")
        who = await plane.auth.authenticate(secret)
        job = JobIn.model_validate({}).to_job(new_job_id(), team="vision", idempotency_key=None)
        [rec], _ = await plane.jobs.submit(who, [Draft(job, "revocation-test")])
        drop_in = CompatJobs(plane, settings.compat)
        waiting = asyncio.ensure_future(drop_in.wait(caller_for(who, None), rec.job.id))
        await _eventually(lambda: plane.auth.sessions.held(who.token_id) == 1)

        await plane.auth.revoke(info.id)
        with pytest.raises(Unauthenticated, match="revoked"):
            await asyncio.wait_for(waiting, DEADLINE_S)
        assert (await plane.jobs.get(ADMIN_PRINCIPAL, rec.job.id)).state.value == "queued"
    finally:
        await plane.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _replicas:
    """Two control planes on one PostgreSQL schema, each with its loops off."""

    def __init__(self, db_url: str, home: Path) -> None:
        self.settings = Settings(home=home, store={"db": db_url})  # type: ignore[arg-type]
        self.planes: list[ControlPlane] = []

    async def __aenter__(self) -> tuple[ControlPlane, ControlPlane]:
        for _ in range(2):
            plane = create_plane(self.settings, run_loops=False)
            await plane.start()
            self.planes.append(plane)
        return self.planes[0], self.planes[1]

    async def __aexit__(self, *_: object) -> None:
        for plane in reversed(self.planes):
            await plane.stop()


async def _forever() -> AsyncIterator[int]:
    """A stream that never has anything to say (as an idle SSE feed)."""
    await asyncio.Event().wait()
    yield 0


async def _eventually(probe: Any) -> None:
    for _ in range(int(DEADLINE_S / 0.02)):
        if probe():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def _postgres_up() -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


async def _drop(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(host="127.0.0.1", port=5432, user="postgres", database="test")
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
