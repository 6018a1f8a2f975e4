"""Benchmark: one server holding many connected agents that heartbeat every second.

Usage: ``python bench/agents.py [--agents 1000] [--seconds 20] [--ramp 200] [--node-timeout 30]``

``corral server`` (SQLite in a temporary home) runs as a subprocess, so its
CPU figure is its own. This process then runs ``--agents`` agent clients: the
real ``corral.agent.link.LinkClient``, each on its own gRPC connection with
one fake GPU and nothing to run, heartbeating every second. They dial in at
``--ramp`` per second; once all are connected the server is measured for
``--seconds``. The lag is the server's own figure (its Prometheus histogram
``corral_agent_heartbeat_lag_seconds``): from the agent sending a heartbeat
to the server handling it, both clocks being this machine's.

Prints::

    agents connected: 1000/1000 in 7.1 s
    heartbeats/s: 998
    server CPU: 41 % of one core
    agent clients CPU (this process): 63 % of one core
    heartbeat lag: mean 3.2 ms, p50 <= 5 ms, p99 <= 20 ms
    nodes lost during the run: 0
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from corral.agent.demo import DemoExecutor
from corral.agent.fingerprint import FakeGpus
from corral.agent.link import LinkClient, LinkSettings, parse_server
from corral.agent.supervisor import Supervisor
from corral.agent.wire import Identity
from corral.core import WallClock

ADMIN = "corral_admin_bench-agents-token-for-the-fleet"
CLI = "from corral.cli.main import main; main()"
METRIC = "corral_agent_heartbeat_lag_seconds"


@dataclass(frozen=True)
class Server:
    proc: subprocess.Popen[str]
    http: str
    agents: str


def start_server(home: str, node_timeout: float) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_ADMIN_TOKEN": ADMIN, "CORRAL_AGENTS__PORT": "0", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-c", CLI, "server", "--home", home, "--port", "0"]
    argv += ["--node-timeout", str(node_timeout), "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    http = agents = ""
    deadline = time.monotonic() + 60
    while not (http and agents) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("corral server exited before it was ready")
        if m := re.search(r"listening on (http://\S+)", line):
            http = m.group(1)
        if m := re.search(r"--server (grpc://\S+)", line):
            agents = m.group(1)
    return Server(proc, http, agents)


def client(agents_url: str, name: str) -> LinkClient:
    clock = WallClock()
    supervisor = Supervisor({"demo": DemoExecutor(clock)}, clock, default="demo")
    identity = Identity(node=name, cpus=8, backends=("demo",), version="bench")
    settings = LinkSettings(token=ADMIN, heartbeat_s=1.0)
    gpus = FakeGpus.parse("1x RTX 4090 24GiB")
    return LinkClient([parse_server(agents_url)], settings, supervisor, identity, gpus, clock)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """The heartbeat counter and lag histogram series from the server's /metrics."""
    text = (await http.get("/metrics")).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("corral_agent_", f"{METRIC}")) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def lag_figures(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, float]:
    """(mean, p50 upper bound, p99 upper bound) in seconds over the window between scrapes."""
    count = after.get(f"{METRIC}_count", 0) - before.get(f"{METRIC}_count", 0)
    total = after.get(f"{METRIC}_sum", 0) - before.get(f"{METRIC}_sum", 0)
    buckets = sorted(
        (float(m.group(1)), after[k] - before.get(k, 0.0))
        for k in after
        if (m := re.search(r'_bucket\{le="([^"]+)"\}', k)) and m.group(1) != "+Inf"
    )

    def bound(q: float) -> float:
        for le, cumulative in buckets:
            if cumulative >= q * count:
                return le
        return float("inf")

    return (total / count if count else float("nan")), bound(0.5), bound(0.99)


async def measure(
    server: Server, agents: int, seconds: float, ramp: int, settle_s: float
) -> dict[str, float]:
    clients = [client(server.agents, f"bench-{i:04d}") for i in range(agents)]
    tasks: list[asyncio.Task[None]] = []
    started = time.monotonic()
    for i, c in enumerate(clients):
        tasks.append(asyncio.create_task(c.run()))
        if (i + 1) % ramp == 0:
            await asyncio.sleep(1.0)
    while sum(c.connected.is_set() for c in clients) < agents:
        if time.monotonic() - started > 120 + agents / ramp:
            break
        await asyncio.sleep(0.1)
    connected = sum(c.connected.is_set() for c in clients)
    connect_s = time.monotonic() - started
    async with httpx.AsyncClient(base_url=server.http, timeout=30) as http:
        await asyncio.sleep(settle_s)  # let the ramp's backlog drain before the window opens
        before, cpu0, own0, t0 = (
            await scrape(http),
            cpu_seconds(server.proc.pid),
            own_cpu_seconds(),
            time.monotonic(),
        )
        await asyncio.sleep(seconds)
        after, cpu1, own1, t1 = (
            await scrape(http),
            cpu_seconds(server.proc.pid),
            own_cpu_seconds(),
            time.monotonic(),
        )
        nodes = (await http.get("/v1/nodes", headers={"Authorization": f"Bearer {ADMIN}"})).json()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    wall = t1 - t0
    mean, p50, p99 = lag_figures(before, after)
    beats = after.get("corral_agent_heartbeats_total", 0) - before.get(
        "corral_agent_heartbeats_total", 0
    )
    return {
        "connected": connected,
        "connect_s": connect_s,
        "heartbeats_per_s": beats / wall,
        "server_cpu": (cpu1 - cpu0) / wall,
        "clients_cpu": (own1 - own0) / wall,
        "lag_mean": mean,
        "lag_p50": p50,
        "lag_p99": p99,
        "lost": sum(n["state"] == "lost" for n in nodes),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--ramp", type=int, default=200, help="agents dialling in per second")
    parser.add_argument("--node-timeout", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds before measuring")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as home:
        server = start_server(home, args.node_timeout)
        try:
            f = asyncio.run(measure(server, args.agents, args.seconds, args.ramp, args.settle))
        finally:
            server.proc.terminate()
            server.proc.wait(30)
            if server.proc.stdout is not None:
                server.proc.stdout.close()
    print(f"agents connected: {f['connected']:.0f}/{args.agents} in {f['connect_s']:.1f} s")
    print(f"heartbeats/s: {f['heartbeats_per_s']:.0f}")
    print(f"server CPU: {100 * f['server_cpu']:.0f} % of one core")
    print(f"agent clients CPU (this process): {100 * f['clients_cpu']:.0f} % of one core")
    print(
        f"heartbeat lag: mean {1000 * f['lag_mean']:.1f} ms, "
        f"p50 <= {1000 * f['lag_p50']:.0f} ms, p99 <= {1000 * f['lag_p99']:.0f} ms"
    )
    print(f"nodes lost during the run: {f['lost']:.0f}")
    return 0 if f["connected"] == args.agents and f["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
