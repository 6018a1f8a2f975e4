"""Attack: open event streams until the server starves (issue 45, item 4).

500 streams on ``/v1/events`` replaying all history once took every database
connection: requests answered 500 and ``/healthz`` took 15 s. Now streams are
capped per token and in all (429 with Retry-After past a cap), a new
``/v1/events`` stream starts at "now", and streams read the table a few at a
time, so a small pool always has room for requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import ADMIN_TOKEN, eventually, serve, sse_events
from process_harness import ServerProcess
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

pytestmark = pytest.mark.anyio

PER_TOKEN, TOTAL = 5, 8


def started(db: str, home: Path, **env: str) -> Iterator[ServerProcess]:
    server = ServerProcess(db, home, env={"CORRAL_ADMIN_TOKEN": ADMIN_TOKEN, **env}).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real ``corral server`` with small stream caps."""
    yield from started(
        str(tmp_path / "corral.db"),
        tmp_path,
        CORRAL_LIMITS__STREAMS_PER_TOKEN=str(PER_TOKEN),
        CORRAL_LIMITS__STREAMS_TOTAL=str(TOTAL),
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def team_token(http: httpx.AsyncClient, team: str) -> str:
    body = {"kind": "team", "team": team, "name": f"{team}-app"}
    r = await http.post("/v1/tokens", json=body, headers=bearer(ADMIN_TOKEN))
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


async def open_streams(
    http: httpx.AsyncClient, stack: contextlib.AsyncExitStack, token: str, n: int
) -> list[httpx.Response]:
    """``n`` streams on ``/v1/events``, held open by ``stack``; refused ones read whole."""
    out = []
    for _ in range(n):
        r = await stack.enter_async_context(http.stream("GET", "/v1/events", headers=bearer(token)))
        if r.status_code != 200:
            await r.aread()
        out.append(r)
    return out


async def test_streams_past_the_caps_get_429_while_other_requests_answer(
    capped: ServerProcess,
) -> None:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=capped.url, timeout=10, limits=limits) as http:
        mallory, bob = await team_token(http, "mallory"), await team_token(http, "bob")
        async with contextlib.AsyncExitStack() as bobs:
            async with contextlib.AsyncExitStack() as mallorys:
                flood = await open_streams(http, mallorys, mallory, PER_TOKEN + 20)
                assert [r.status_code for r in flood].count(200) == PER_TOKEN
                refused = [r for r in flood if r.status_code != 200]
                assert {r.status_code for r in refused} == {429}
                assert int(refused[0].headers["Retry-After"]) >= 1
                assert "limits.streams_per_token" in refused[0].json()["message"]
                # Another token gets what is left of the server's cap, then 429 too.
                others = await open_streams(http, bobs, bob, TOTAL - PER_TOKEN + 1)
                assert [r.status_code for r in others][:-1] == [200] * (TOTAL - PER_TOKEN)
                assert others[-1].status_code == 429
                assert "limits.streams_total" in others[-1].json()["message"]
                # Unrelated requests keep answering meanwhile.
                assert (await http.get("/healthz")).status_code == 200
                assert (await http.get("/v1/jobs", headers=bearer(bob))).status_code == 200

            # Mallory's streams are closed: their places come back.
            async def one_more() -> bool:
                async with http.stream("GET", "/v1/events", headers=bearer(bob)) as r:
                    return r.status_code == 200

            assert await eventually(one_more)


async def test_a_new_events_stream_starts_now_and_after_asks_for_history(tmp_path: Path) -> None:
    async with serve(str(tmp_path / "c.db"), tmp_path) as s:

        async def submit() -> str:
            r = await s.admin.post("/v1/jobs", json={"kind": "sample"})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        old = await submit()
        async with (
            s.admin.stream("GET", "/v1/events") as live,
            s.admin.stream("GET", "/v1/events", params={"after": 0}) as history,
        ):
            new = await submit()
            first_live = await anext(sse_events(live))
            first_history = await anext(sse_events(history))
    assert first_live["data"]["job_id"] == new  # not the whole log first
    assert first_history["data"]["job_id"] == old


async def test_a_comfyui_websocket_counts_as_a_stream(tmp_path: Path) -> None:
    sections = {"limits": {"streams_per_token": 1}}
    async with serve(str(tmp_path / "c.db"), tmp_path, sections=sections) as s:
        r = await s.admin.post("/v1/tokens", json={"kind": "team", "team": "t", "name": "app"})
        token = r.json()["token"]
        url = s.base_url.replace("http://", "ws://") + "/ws?clientId=c1"
        async with s.client(token) as http, http.stream("GET", "/v1/events") as held:
            assert held.status_code == 200
            with pytest.raises(InvalidStatus) as refused:
                async with connect(url, additional_headers=bearer(token)):
                    pass
    assert refused.value.response.status_code == 429
    assert "limits.streams_per_token" in refused.value.response.body.decode()


JOBS = 3000  # three full batches: 3,000 events of history, six pages per stream
REPLAYS = 50


@pytest.mark.postgres
async def test_streams_replaying_history_leave_the_pool_to_requests(
    pg_url: str, tmp_path: Path
) -> None:
    """A pool of 2 (4 with overflow, one the scheduling leader's), checkouts failing after
    1 s (a loaded machine may make a request wait that long for its turn): 50 streams
    replay all history from the table (the server restarted, so none of it is in memory)
    while requests must still be answered."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    headers = bearer(ADMIN_TOKEN)
    for server in started(pg_url, tmp_path):
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=headers) as http:
            for _ in range(JOBS // 1000):
                batch = {"jobs": [{"kind": "sample"}] * 1000}
                assert (await http.post("/v1/jobs/batch", json=batch)).status_code == 201
    env = {
        "CORRAL_STORE__POOL_SIZE": "2",
        "CORRAL_STORE__POOL_TIMEOUT_S": "1",
        "CORRAL_LIMITS__STREAMS_PER_TOKEN": str(REPLAYS),
    }
    for server in started(pg_url, tmp_path, **env):
        async with httpx.AsyncClient(
            base_url=server.url, timeout=30, limits=limits, headers=headers
        ) as http:
            done = asyncio.Event()
            replays = [asyncio.create_task(_replay(http)) for _ in range(REPLAYS)]
            probing = asyncio.create_task(_probe(http, done))
            seen = await asyncio.gather(*replays)
            done.set()
            statuses = await probing
        assert seen == [JOBS] * REPLAYS
        assert statuses
        assert max(statuses) < 500, sorted(set(statuses))


async def _replay(http: httpx.AsyncClient) -> int:
    """Follow ``/v1/events`` from the start until every job's submission was seen."""
    submitted = 0
    async with http.stream("GET", "/v1/events", params={"after": 0}) as r:
        assert r.status_code == 200, await r.aread()
        async for frame in sse_events(r):
            submitted += frame["event"] == "job.submitted"
            if submitted == JOBS:
                break
    return submitted


async def _probe(http: httpx.AsyncClient, done: asyncio.Event) -> list[int]:
    """Well-behaved requests while the streams replay: their statuses."""
    statuses: list[int] = []
    while not done.is_set():
        for path in ("/healthz", "/v1/jobs?limit=1"):
            r: Any = await http.get(path)
            statuses.append(r.status_code)
        await asyncio.sleep(0.02)
    return statuses
