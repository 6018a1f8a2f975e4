"""A test-only corral server process whose agents are in-process stubs that really run jobs.

``python stub_server.py --home DIR`` starts the real control plane and HTTP
API (uvicorn, SQLite, the scheduling and liveness loops on the wall clock),
exactly as ``corral server`` does, but with the in-process agent link and two
stub agents ("box-a", "box-b", 2 × RTX 4090 each) on a pilot that plays each
job's payload as a script, so SDK and CLI tests can watch jobs progress and
finish without GPUs:

* ``steps`` (default 2) progress reports, ``step_s`` seconds apart;
* ``preview: true``: a small PNG preview at each step; ``log: true``: a log line per step;
* ``gate: PATH``: after the steps, wait until PATH exists (a test's "go on" signal);
* ``fail: MESSAGE``: fail (not retryable) instead of finishing;
* ``files: {name: text}``: the result files (default ``out.txt`` = ``done <job id>``).

Cancel and interrupt orders are obeyed at once (an interrupt finishes with
``partial.txt``). Prints ``corral server listening on URL`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import zlib
from pathlib import Path
from typing import Any

import uvicorn

from corral.core.states import StopReason
from corral.server.agentlink.base import Assignment, StopOrder
from corral.server.agentlink.inprocess import InProcessLink, StubAgent, inventory
from corral.server.app import create_app, create_plane
from corral.server.plane import StartReport
from corral.server.settings import Settings

ADMIN_TOKEN = "corral_admin_sdk-test-token-for-live-servers"
NODES = ("box-a", "box-b")


def png(shade: int) -> bytes:
    """A valid 2×2 grey PNG (so a test can check the bytes are an image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes([shade % 256] * 2) for _ in range(2))
    header = struct.pack(">IIBBBBB", 2, 2, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


class Pilot:
    """Runs every assignment of one stub agent as its own task; routes stop orders to it."""

    def __init__(self, agent: StubAgent) -> None:
        self.agent = agent
        self.stops: dict[str, asyncio.Future[StopReason]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def fly(self) -> None:
        while True:
            item = await self.agent.inbox.get()
            if isinstance(item, StopOrder):
                stop = self.stops.get(item.allocation_id)
                if stop is not None and not stop.done():
                    stop.set_result(item.reason)
                continue
            self.stops[item.allocation_id] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self.run(item))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def run(self, a: Assignment) -> None:
        stop = self.stops[a.allocation_id]
        script: dict[str, Any] = dict(a.jobs[0].payload)
        await self.agent.start(a)
        steps = int(script.get("steps", 2))
        for i in range(steps):
            if stop.done():
                break
            await self.step(a, script, i, steps)
            await self.pause(stop, float(script.get("step_s", 0.0)))
        gate = script.get("gate")
        while gate and not stop.done() and not Path(gate).exists():
            await self.pause(stop, 0.02)
        await self.end(a, script, stop)

    async def step(self, a: Assignment, script: dict[str, Any], i: int, steps: int) -> None:
        await self.agent.progress(a, (i + 1) / steps, f"step {i + 1}/{steps}")
        for work in a.jobs:
            if script.get("preview"):
                await self.agent.preview(a, work.job_id, png(40 * (i + 1)))
        if script.get("log"):
            await self.agent.log(a, f"step {i + 1} of {steps}")

    async def pause(self, stop: asyncio.Future[StopReason], seconds: float) -> None:
        if seconds > 0:
            await asyncio.wait([stop], timeout=seconds)

    async def end(
        self, a: Assignment, script: dict[str, Any], stop: asyncio.Future[StopReason]
    ) -> None:
        self.stops.pop(a.allocation_id, None)
        if stop.done() and stop.result() is StopReason.INTERRUPT:
            await self.agent.finish(a, {w.job_id: {"partial.txt": b"partial"} for w in a.jobs})
        elif stop.done():
            await self.agent.stopped(a)
        elif script.get("fail"):
            await self.agent.fail(a, str(script["fail"]), retryable=False)
        else:
            files = {k: str(v).encode() for k, v in dict(script.get("files") or {}).items()}
            results = {w.job_id: files or {"out.txt": f"done {w.job_id}".encode()} for w in a.jobs}
            await self.agent.finish(a, results)


async def start_agents(plane: Any, link: InProcessLink) -> None:
    for name in NODES:
        agent = StubAgent(plane.agents, link, inventory(name, 2, backends=frozenset({"stub"})))
        await agent.connect()
        pilot = Pilot(agent)
        keep.append(asyncio.create_task(pilot.fly()))
        keep.append(asyncio.create_task(heartbeat(agent)))


async def heartbeat(agent: StubAgent) -> None:
    while True:
        await asyncio.sleep(2.0)
        await agent.heartbeat()


keep: list[asyncio.Task[None]] = []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, required=True)
    home = parser.parse_args().home
    settings = Settings(
        home=home,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        store={"db": str(home / "corral.db")},  # type: ignore[arg-type]
        api={"sse_poll_s": 0.2},  # type: ignore[arg-type]
        scheduling={"debounce_s": 0.001, "node_timeout_s": 60.0},  # type: ignore[arg-type]
        log_level="warning",
    )
    link = InProcessLink()
    plane = create_plane(settings, link=link)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    def started(_: StartReport) -> None:
        async def ready() -> None:
            await start_agents(plane, link)
            print(f"corral server listening on http://127.0.0.1:{port}", flush=True)

        keep.append(asyncio.get_running_loop().create_task(ready()))

    app = create_app(plane=plane, on_started=started)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
