"""Real HTTP against an in-process server: uvicorn on a loopback socket, stub agents attached.

The control plane runs with its loops on the wall clock, exactly as
``corral server`` does, but the agent link is the in-process stub so tests
can play the agent. Waiting is done with ``eventually`` (poll with a
deadline), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

from corral.server.agentlink.inprocess import InProcessLink, StubAgent, inventory
from corral.server.app import create_app, create_plane
from corral.server.plane import ControlPlane
from corral.server.serving import uvicorn_config
from corral.server.settings import Settings

ADMIN_TOKEN = "corral_admin_test-token-for-http-tests"
T = TypeVar("T")


@dataclass
class Served:
    base_url: str
    plane: ControlPlane
    link: InProcessLink
    admin: httpx.AsyncClient

    def client(self, token: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=10)

    async def agent(self, name: str, gpus: int = 1, **kw: Any) -> StubAgent:
        agent = StubAgent(self.plane.agents, self.link, inventory(name, gpus, **kw))
        await agent.connect()
        return agent


@contextlib.asynccontextmanager
async def serve(
    db_url: str, home: Path, *, sections: dict[str, Any] | None = None, **api: Any
) -> AsyncIterator[Served]:
    """A server on ``db_url``; ``api`` settings, and other ``sections`` (e.g. ``limits``)."""
    sections = dict(sections or {})
    scheduling = {"debounce_s": 0.001, **sections.pop("scheduling", {})}
    settings = Settings(
        home=home,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        store={"db": db_url},  # type: ignore[arg-type]
        api={"sse_poll_s": 0.2, **api},  # type: ignore[arg-type]
        scheduling=scheduling,  # type: ignore[arg-type]
        log_level="warning",
        **sections,
    )
    link = InProcessLink()
    plane = create_plane(settings, link=link)
    app = create_app(plane=plane)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(app, settings.api, log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: _started(server), timeout=20)
    base = f"http://127.0.0.1:{port}"
    admin = httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
    )
    try:
        yield Served(base, plane, link, admin)
    finally:
        await admin.aclose()
        server.should_exit = True
        await task
        sock.close()


async def _started(server: uvicorn.Server) -> bool:
    return server.started


async def eventually(probe: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        await asyncio.sleep(0.02)


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Parse a text/event-stream response into ``{"id", "event", "data"}`` frames."""
    frame: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in frame:
                frame["data"] = json.loads(frame["data"])
                yield frame
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            frame[key] = value
