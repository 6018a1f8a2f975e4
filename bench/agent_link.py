"""The agent and its link alone: what an assignment costs from the server's link to an agent
and back, without the server's HTTP, database and scheduling (issue 9, the agent side).

    python bench/agent_link.py [--agents 4] [--jobs 4000] [--clients 16] [--idle 300]

This process serves the real gRPC link (``GrpcLink`` and its servicer) with a stand-in
for the server's inbound side that accepts every update at once; ``--agents`` real
``corral agent`` processes dial it and run the no-op Python handler of the end-to-end
benchmark (``e2e_noop:noop``). Three shapes, as in ``bench/e2e.py``:

* idle: one assignment at a time (the latency from ``GrpcLink.assign`` to the
  inbound side's ``finished``: the agent's whole share of a round trip);
* concurrent: ``--clients`` assignments in flight, each followed by the next;
* batch: every assignment at once.

Prints per shape jobs/s, the agents' CPU ms per job (all agents together), this
process's CPU ms per job (the server's end of the link, plus the driver), and the
assign-to-finished latency p50/p99. CPU per job is the figure to compare between
runs: the machine is shared, so wall-clock figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.core import WallClock
from corral.core.model import Gpu, JobKind
from corral.server.agentlink.base import (
    Ack,
    Assignment,
    HelloReply,
    Inventory,
    JobWork,
    ResultBlob,
    Running,
    Standing,
)
from corral.server.agentlink.grpc_link import GrpcLink
from corral.server.blobs import LocalBlobStore
from corral.server.settings import AgentLinkSettings

HERE = Path(__file__).resolve().parent
TOKEN = "bench-agent-link-token"
CLI = "from corral.cli.main import main; main()"


class Inbound:
    """The server's inbound side, reduced to noting when each allocation started and ended."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.waiters: dict[str, asyncio.Future[float]] = {}
        self.other = 0

    async def authenticate(self, token: str) -> Inbound:
        return self  # the admission too: its streams are tied to nothing

    @property
    def token_id(self) -> str:
        return "tok_bench"

    def hold(self, node: str, end: Callable[[str], bool]) -> Callable[[], None]:
        return lambda: None

    async def hello(self, inventory: Inventory, running: Sequence[Running]) -> HelloReply:
        self.nodes.add(inventory.node)
        return HelloReply(heartbeat_s=1.0)

    async def heartbeat(self, node: str, gpus: Sequence[Gpu] | None = None) -> None:
        return None

    async def finished(
        self, node: str, allocation_id: str, attempt: int, results: Sequence[ResultBlob], **_: Any
    ) -> Ack:
        waiter = self.waiters.pop(allocation_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(time.perf_counter())
        return Ack.ACCEPTED

    async def ran(
        self, node: str, allocation_id: str, attempt: int, results: Sequence[ResultBlob], **_: Any
    ) -> tuple[Ack, Ack]:
        started = await self._other()
        return started, await self.finished(node, allocation_id, attempt, results)

    async def failed(
        self, node: str, allocation_id: str, attempt: int, error: str, **_: Any
    ) -> Ack:
        raise RuntimeError(f"allocation {allocation_id} failed: {error}")

    async def _other(self, *_: Any, **__: Any) -> Ack:
        self.other += 1
        return Ack.ACCEPTED

    started = progress = preview = log = checkpoint = stopped = _other

    async def may_fetch(self, allocation_id: str, attempt: int, blob_id: str) -> bool:
        return False

    async def claim(self, node: str, key: str) -> None:
        return None  # every agent of the bench has its own name

    async def uploads_read(self, allocation_id: str, blob_ids: Sequence[str]) -> None:
        return None

    async def upload_standing(
        self, node: str, key: str, allocation_id: str, attempt: int
    ) -> Standing:
        return Standing.FOREIGN  # the bench's results ride inline


@dataclass(frozen=True)
class Figures:
    shape: str
    jobs: int
    seconds: float
    agents_cpu_s: float
    link_cpu_s: float
    latencies_s: list[float]

    def line(self) -> str:
        lat = sorted(self.latencies_s)
        p50 = statistics.median(lat) * 1000
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        return (
            f"{self.shape:11} {self.jobs / self.seconds:8.0f} "
            f"{self.agents_cpu_s * 1000 / self.jobs:10.3f} "
            f"{self.link_cpu_s * 1000 / self.jobs:10.3f} {p50:9.2f}ms {p99:9.2f}ms"
        )


class Bench:
    def __init__(self, link: GrpcLink, inbound: Inbound, pids: list[int]) -> None:
        self.link, self.inbound, self.pids = link, inbound, pids
        self.nodes = sorted(inbound.nodes)
        self._ids = itertools.count(1)

    async def one(self, node: str) -> float:
        n = next(self._ids)
        alloc, job = f"a{n}", f"j{n}"
        done = asyncio.get_running_loop().create_future()
        self.inbound.waiters[alloc] = done
        work = JobWork(job, JobKind.CUSTOM, {"n": n})
        t0 = time.perf_counter()
        await self.link.assign(node, Assignment(alloc, 1, node, (work,), cpus=1, on_cpu=True))
        return await done - t0

    async def shape(self, name: str, jobs: int, clients: int, gap_s: float = 0.0) -> Figures:
        nodes = itertools.cycle(self.nodes)
        latencies: list[float] = []

        async def client(count: int) -> None:
            for _ in range(count):
                latencies.append(await self.one(next(nodes)))
                if gap_s:
                    await asyncio.sleep(gap_s)

        agents0, link0, t0 = self.agents_cpu(), self_cpu_s(), time.perf_counter()
        per, extra = divmod(jobs, clients)
        await asyncio.gather(*(client(per + (i < extra)) for i in range(clients)))
        seconds = time.perf_counter() - t0
        agents, link = self.agents_cpu() - agents0, self_cpu_s() - link0
        return Figures(name, jobs, seconds, agents, link, latencies)

    def agents_cpu(self) -> float:
        return sum(proc_cpu_s(pid) for pid in self.pids)


async def run(args: argparse.Namespace, home: Path) -> list[Figures]:
    inbound = Inbound()
    link = GrpcLink(AgentLinkSettings(host="127.0.0.1", port=0))
    address = await link.start(inbound, LocalBlobStore(home / "blobs"), WallClock())  # type: ignore[arg-type]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, (str(HERE), os.environ.get("PYTHONPATH")))),
    )
    procs = []
    for i in range(args.agents):
        argv = [sys.executable, "-c", CLI, "agent", "--server", address, "--token", TOKEN]
        argv += ["--name", f"bench-{i}", "--handler", "e2e_noop:noop", "--cpus", "64"]
        argv += ["--work-dir", str(home / f"agent-{i}"), "--log-level", "warning"]
        quiet = None if os.environ.get("BENCH_VERBOSE") else subprocess.DEVNULL
        procs.append(subprocess.Popen(argv, env=env, stdout=quiet, stderr=quiet))
    try:
        deadline = time.monotonic() + 60
        while len(inbound.nodes) < args.agents or len(link.sessions) < args.agents:
            if time.monotonic() > deadline:
                raise RuntimeError("the agents did not connect within 60 s")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the hellos' answers and model reports settle
        bench = Bench(link, inbound, [p.pid for p in procs])
        rest0 = bench.agents_cpu()
        await asyncio.sleep(args.rest)
        rest = (bench.agents_cpu() - rest0) / args.rest / args.agents
        print(f"an agent at rest (connected, no work): {rest * 100:.2f} % of one core")
        if args.warmup:
            await bench.shape("warm-up", args.warmup, 8)
        out = [await bench.shape("idle", args.idle, 1)]
        if args.gap_ms:
            out.append(await bench.shape("idle+gap", args.idle, 1, args.gap_ms / 1000))
        out.append(await bench.shape("concurrent", args.jobs, args.clients))
        out.append(await bench.shape("batch", args.jobs, args.jobs))
        return out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        await link.close(0)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid``: the scheduler's nanosecond count (schedstat),
    not ``stat``'s clock ticks, which charge a whole tick to whoever runs when it fires and
    so overcharge processes woken briefly by timers."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def self_cpu_s() -> float:
    return proc_cpu_s(os.getpid())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--idle", type=int, default=300, help="sequential round trips")
    ap.add_argument(
        "--gap-ms", type=float, default=15.0, help="idle again, with this pause between jobs"
    )
    ap.add_argument("--rest", type=float, default=3.0, help="seconds measured with no work")
    ap.add_argument("--warmup", type=int, default=200, help="jobs run first, not measured")
    args = ap.parse_args(argv)
    logging.getLogger("corral").setLevel(logging.CRITICAL)  # agents leaving at the end is noise
    with tempfile.TemporaryDirectory(prefix="corral-agent-link-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    print(
        f"\nagent link: {args.agents} agents, no-op python handler, load {os.getloadavg()[0]:.1f}\n"
    )
    head = f"{'shape':11} {'jobs/s':>8} {'agents ms':>10} {'link ms':>10} {'p50':>11} {'p99':>11}"
    print(head + "   (ms: CPU per job)\n" + "-" * len(head))
    for f in figures:
        print(f.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
