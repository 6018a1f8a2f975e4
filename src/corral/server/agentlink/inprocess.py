"""The in-process agent link and a stub agent: the test doubles of the agent seam.

``InProcessLink`` implements ``AgentLink`` by handing messages to
``StubAgent`` objects in the same process. A ``StubAgent`` speaks the inbound
side exactly as a real agent would (hello with inventory, heartbeats,
ready / started / progress / preview / log / checkpoint / finished / failed /
stopped), either step by step as a test scripts it, or on ``autopilot``
(start, report progress, finish with one small result per job).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from corral.core.errors import LinkError
from corral.core.model import EMPTY, Gpu
from corral.core.resources import GIB
from corral.server.agentlink.base import (
    Ack,
    AgentInbound,
    Assignment,
    HelloReply,
    Inventory,
    ResultBlob,
    Running,
    StopOrder,
)


@dataclass
class Sent:
    """Everything the server sent through the link, for assertions."""

    assigned: list[Assignment] = field(default_factory=list)
    stopped: list[StopOrder] = field(default_factory=list)
    intake: list[tuple[str, bool]] = field(default_factory=list)
    go: list[tuple[str, str, int]] = field(default_factory=list)  # node, allocation, attempt


class InProcessLink:
    """``AgentLink`` for tests and for a server with no agent transport configured."""

    def __init__(self) -> None:
        self.agents: dict[str, StubAgent] = {}
        self.sent = Sent()

    def attach(self, agent: StubAgent) -> None:
        self.agents[agent.node] = agent

    def detach(self, node: str) -> None:
        self.agents.pop(node, None)

    def _agent(self, node: str) -> StubAgent:
        agent = self.agents.get(node)
        if agent is None:
            raise LinkError(f"node {node} is not connected")
        return agent

    async def assign(self, node: str, assignment: Assignment) -> None:
        agent = self._agent(node)
        self.sent.assigned.append(assignment)
        agent.inbox.put_nowait(assignment)

    async def stop(self, node: str, order: StopOrder) -> None:
        agent = self._agent(node)
        self.sent.stopped.append(order)
        agent.inbox.put_nowait(order)

    async def set_intake(self, node: str, *, open: bool) -> None:
        agent = self._agent(node)
        self.sent.intake.append((node, open))
        agent.intake_open = open

    async def go(self, node: str, allocation_id: str, attempt: int) -> None:
        agent = self._agent(node)
        self.sent.go.append((node, allocation_id, attempt))
        agent.go.append(allocation_id)


def inventory(
    name: str, gpus: int = 1, model: str = "RTX 4090", vram_gib: int = 24, **kw: object
) -> Inventory:
    """A fake machine: ``gpus`` cards of ``model`` with ``vram_gib`` each."""
    cards = tuple(Gpu(i, model, vram_gib * GIB) for i in range(gpus))
    return Inventory(node=name, gpus=cards, cpus=kw.pop("cpus", 8), **kw)  # type: ignore[arg-type]


class StubAgent:
    """A scriptable stand-in for ``corral agent`` that calls the server's inbound side."""

    def __init__(self, server: AgentInbound, link: InProcessLink, inv: Inventory) -> None:
        self.server = server
        self.link = link
        self.inv = inv
        self.inbox: asyncio.Queue[Assignment | StopOrder] = asyncio.Queue()
        self.intake_open = True
        self.go: list[str] = []  # allocations the server said go to (a gang's two phases)
        self.running: dict[str, Assignment] = {}
        self.acks: list[Ack] = []
        self._pilot: asyncio.Task[None] | None = None

    @property
    def node(self) -> str:
        return self.inv.node

    async def connect(self, running: Sequence[Assignment] = ()) -> HelloReply:
        """Attach to the link and say hello, reporting ``running`` as what it holds."""
        self.link.attach(self)
        reply = await self.server.hello(
            self.inv, [Running(a.allocation_id, a.attempt) for a in running]
        )
        for a in reply.assign:
            self.inbox.put_nowait(a)
        for s in reply.stop:
            self.inbox.put_nowait(s)
        self.intake_open = reply.intake_open
        return reply

    def disconnect(self) -> None:
        """Vanish without a word, as a machine that lost power would."""
        self.link.detach(self.node)
        if self._pilot is not None:
            self._pilot.cancel()

    async def heartbeat(self) -> None:
        await self.server.heartbeat(self.node)

    async def receive(self, timeout: float = 5.0) -> Assignment | StopOrder:
        """The next message from the server."""
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def next_assignment(self, timeout: float = 5.0) -> Assignment:
        while True:
            item = await self.receive(timeout)
            if isinstance(item, Assignment):
                self.running[item.allocation_id] = item
                return item

    def pending(self) -> list[Assignment | StopOrder]:
        """Messages received so far, without waiting."""
        items = []
        while not self.inbox.empty():
            items.append(self.inbox.get_nowait())
        return items

    async def start(self, a: Assignment) -> Ack:
        return self._note(await self.server.started(self.node, a.allocation_id, a.attempt))

    async def ready(self, a: Assignment) -> Ack:
        """Say a gang replica is prepared; the server says go once its whole gang is."""
        return self._note(await self.server.ready(self.node, a.allocation_id, a.attempt))

    async def progress(self, a: Assignment, fraction: float, message: str | None = None) -> Ack:
        ack = await self.server.progress(
            self.node, a.allocation_id, a.attempt, fraction, message=message
        )
        return self._note(ack)

    async def preview(self, a: Assignment, job_id: str, data: bytes) -> Ack:
        return self._note(
            await self.server.preview(self.node, a.allocation_id, a.attempt, job_id, data)
        )

    async def log(self, a: Assignment, *lines: str) -> Ack:
        return self._note(await self.server.log(self.node, a.allocation_id, a.attempt, lines))

    async def checkpoint(self, a: Assignment, ref: str, step: int = 0) -> Ack:
        ack = await self.server.checkpoint(self.node, a.allocation_id, a.attempt, ref, step=step)
        return self._note(ack)

    async def finish(
        self,
        a: Assignment,
        results: Mapping[str, Mapping[str, bytes]] | None = None,
        *,
        stopped: Sequence[str] = (),
        modified: Mapping[str, str] = EMPTY,
    ) -> Ack:
        """Report success; ``results`` maps job id -> file name -> bytes (default: one per job);
        ``stopped``: jobs of a batch stopped on their own with no result; ``modified``: what
        the agent filled in (a default model, a seed)."""
        self.running.pop(a.allocation_id, None)
        blobs = _blobs(a, results)
        ack = await self.server.finished(
            self.node, a.allocation_id, a.attempt, blobs, stopped=stopped, modified=modified
        )
        return self._note(ack)

    async def ran(
        self, a: Assignment, results: Mapping[str, Mapping[str, bytes]] | None = None
    ) -> tuple[Ack, Ack]:
        """Report the start and the success together, as a gRPC agent's bundle of both is."""
        self.running.pop(a.allocation_id, None)
        blobs = _blobs(a, results)
        started, finished = await self.server.ran(self.node, a.allocation_id, a.attempt, blobs)
        return self._note(started), self._note(finished)

    async def fail(
        self,
        a: Assignment,
        error: str = "boom",
        *,
        retryable: bool = True,
        job_id: str = "",
        finished: Mapping[str, Mapping[str, bytes]] | None = None,
    ) -> Ack:
        """Report a failure; a batch cut short names the job that failed (``job_id``) and
        the jobs that finished before it (``finished``: job id -> file name -> bytes)."""
        self.running.pop(a.allocation_id, None)
        ack = await self.server.failed(
            self.node,
            a.allocation_id,
            a.attempt,
            error,
            retryable=retryable,
            job_id=job_id,
            finished=list(finished or ()),
            results=_blobs(a, finished) if finished else (),
        )
        return self._note(ack)

    async def stopped(self, a: Assignment) -> Ack:
        self.running.pop(a.allocation_id, None)
        return self._note(await self.server.stopped(self.node, a.allocation_id, a.attempt))

    def _note(self, ack: Ack) -> Ack:
        self.acks.append(ack)
        return ack

    def autopilot(self) -> None:
        """Run every assignment at once (start, 50% progress, finish) and obey every stop."""
        self._pilot = asyncio.get_running_loop().create_task(self._fly())

    async def stop_autopilot(self) -> None:
        if self._pilot is not None:
            self._pilot.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pilot

    async def _fly(self) -> None:
        while True:
            item = await self.inbox.get()
            if isinstance(item, StopOrder):
                a = self.running.get(item.allocation_id)
                if a is not None:
                    await self.stopped(a)
                continue
            self.running[item.allocation_id] = item
            await self.start(item)
            await self.progress(item, 0.5)
            await self.finish(item)


def _blobs(a: Assignment, results: Mapping[str, Mapping[str, bytes]] | None) -> list[ResultBlob]:
    """``results`` (job id -> file name -> bytes; default: one file per job) as blobs."""
    if results is None:
        results = {w.job_id: {"out.txt": f"done {w.job_id}".encode()} for w in a.jobs}
    return [
        ResultBlob(job_id, name, data, "text/plain")
        for job_id, files in results.items()
        for name, data in files.items()
    ]
