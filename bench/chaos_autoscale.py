"""Chaos for the autoscaler (issue 49): a load that rises and falls, a provider whose list
lags, and a server killed several times; does it ever run more machines than it may?

Usage::

    python bench/chaos_autoscale.py [--minutes 4] [--peak 6] [--max-nodes 3] [--kills 3]
                                    [--down-s 6] [--lag-s 4] [--out chaos_autoscale.png]

Real processes on this machine: one ``corral server`` on SQLite whose command
provider is ``examples/autoscale/local_provider.py`` (its "machines" are real
``corral agent`` processes with one fake GPU; its ``list`` lags ``--lag-s``
behind its launches, as a cloud API's does). A client submits one-GPU jobs of
``--job-s`` seconds, at a rate that rises to ``--peak`` jobs per 10 s and falls
again over ``--minutes``, each with an Idempotency-Key and retried while the
server is down. ``--kills`` times the server is killed with SIGKILL, stays down
``--down-s`` and is started again on the same database; the agents keep
running their work meanwhile.

Every second the harness samples the ground truth, from the provider's own
records (the machines alive, joined or not) and the API (work queued, nodes
joined, the server up or down), then prints, one ``name: value`` per line::

    overspend: 0 machine-seconds beyond max_nodes
    lost: 0
    completed twice: 0
    idle machine-seconds: 41 (idle_s 8, scale_up_delay_s 2)

and draws the figure (``--out``, matplotlib): work queued, machines wanted
(the work in the system, one machine each, up to ``max_nodes``), machines
launching, machines running, and the server's downtime shaded. Exit status 1
when a machine ran beyond ``max_nodes``, a job was lost or completed twice.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
from chaos_cluster import ADMIN, CLI, Proc, free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "autoscale" / "local_provider.py"


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    queued: int | None  # None: the server was down
    active: int | None  # queued + placed + running
    launching: int  # machines alive whose agent has not joined (as far as last seen)
    running: int  # machines alive whose agent joined
    idle: int  # joined machines without work


@dataclass
class Run:
    args: argparse.Namespace
    home: Path
    provider_dir: Path
    started: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    down: list[tuple[float, float]] = field(default_factory=list)  # (from, to) seconds
    keys: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    unsent: list[str] = field(default_factory=list)
    joined: set[str] = field(default_factory=set)  # node names last seen joined
    busy: set[str] = field(default_factory=set)
    http: str = ""  # the server's API address
    audit: dict[str, int] = field(default_factory=dict)

    def now(self) -> float:
        return time.monotonic() - self.started


def main() -> int:
    args = parse_args()
    # A machine the run killed may still be writing its last lines into the provider's
    # folder as the run ends: its files go with the rest, or stay in /tmp if they cannot.
    with tempfile.TemporaryDirectory(
        prefix="corral-chaos-autoscale-", ignore_cleanup_errors=True
    ) as tmp:
        run = Run(args, Path(tmp) / "server", Path(tmp) / "provider")
        server = server_proc(run, Path(tmp))
        try:
            asyncio.run(drive(run, server))
        finally:
            server.kill9()
            stop_machines(run)
    figures = report(run)
    for name, value in figures.items():
        print(f"{name}: {value}")
    plot(run, Path(args.out))
    print(f"figure: {args.out}")
    failed = run_overspend(run) > 0 or figures["lost"] or figures["completed twice"]
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=4.0, help="how long the load lasts")
    p.add_argument("--peak", type=float, default=6.0, help="jobs per 10 s at the load's peak")
    p.add_argument("--job-s", type=float, default=6.0, help="how long one job runs")
    p.add_argument("--max-nodes", type=int, default=3)
    p.add_argument("--kills", type=int, default=3, help="times the server is killed")
    p.add_argument("--down-s", type=float, default=6.0, help="how long it stays down")
    p.add_argument("--lag-s", type=float, default=4.0, help="how far the list lags launches")
    p.add_argument("--idle-s", type=float, default=8.0)
    p.add_argument("--scale-up-delay-s", type=float, default=2.0)
    p.add_argument("--drain-s", type=float, default=90.0, help="most time for work to finish")
    p.add_argument("--out", default="chaos_autoscale.png")
    return p.parse_args(argv)


def server_proc(run: Run, tmp: Path) -> Proc:
    a = run.args
    pools = tmp / "pools.yaml"
    pools.write_text(
        "pools:\n  - {name: g4090, gpus: 1, gpu_model: RTX 4090, vram: 24GiB, cpus: 2, "
        f"max_nodes: {a.max_nodes}, cost_per_hour: 0.5}}\n"
    )
    run.http = f"http://127.0.0.1:{free_port()}"
    agents = free_port()
    argv = [sys.executable, "-c", CLI, "server", "--home", str(run.home)]
    argv += ["--port", run.http.rsplit(":", 1)[1], "--node-timeout", "30"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= dict(
        PYTHONUNBUFFERED="1",
        CORRAL_ADMIN_TOKEN=ADMIN,
        CORRAL_AGENTS__PORT=str(agents),
        CORRAL_AUTOSCALE__POOLS_FILE=str(pools),
        CORRAL_AUTOSCALE__COMMAND=f"{sys.executable} {EXAMPLE}",
        CORRAL_AUTOSCALE__TICK_S="0.5",
        CORRAL_AUTOSCALE__SCALE_UP_DELAY_S=str(a.scale_up_delay_s),
        CORRAL_AUTOSCALE__IDLE_S=str(a.idle_s),
        CORRAL_AUTOSCALE__BOOT_TIMEOUT_S="60",
        CORRAL_LOCAL_PROVIDER_DIR=str(run.provider_dir),
        CORRAL_LOCAL_PROVIDER_LAG_S=str(a.lag_s),
        CORRAL_LOCAL_PROVIDER_GRACE_S="3",
    )
    return Proc("server", argv, env, tmp / "server.log")


async def drive(run: Run, server: Proc) -> None:
    a = run.args
    load_s = a.minutes * 60
    kills = [load_s * (i + 1) / (a.kills + 1) for i in range(a.kills)]
    server.start()
    async with httpx.AsyncClient(
        base_url=run.http,
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=5,
    ) as http:
        await wait_up(http, server)
        owed = 0.0
        while run.now() < load_s or (run.now() < load_s + a.drain_s and await unfinished(http)):
            t = run.now()
            if kills and t >= kills[0]:
                kills.pop(0)
                await kill_and_restart(run, server, http)
                continue
            if t < load_s:
                owed += rate(t, load_s, a.peak / 10)
                while owed >= 1:
                    owed -= 1
                    run.unsent.append(uuid.uuid4().hex)
            await submit(run, http)
            await sample(run, http, up=True)
            await asyncio.sleep(1.0)
        for _ in range(int(a.idle_s * 2) + 6):  # long enough to see the idle machines go
            await sample(run, http, up=True)
            await asyncio.sleep(1.0)
        run.audit = await audit(run, http)


def rate(t: float, span: float, peak: float) -> float:
    """Jobs per second at ``t``: up to ``peak`` at mid-span, down again (a sine hump)."""
    return peak * math.sin(math.pi * t / span) ** 2 if 0 <= t <= span else 0.0


async def kill_and_restart(run: Run, server: Proc, http: httpx.AsyncClient) -> None:
    start = run.now()
    server.kill9()
    while run.now() - start < run.args.down_s:
        await sample(run, http, up=False)
        await asyncio.sleep(1.0)
    server.start()
    await wait_up(http, server)
    run.down.append((start, run.now()))


async def wait_up(http: httpx.AsyncClient, server: Proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive:
            raise RuntimeError(f"the server exited:\n{server.tail()}")
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the server never came up:\n{server.tail()}")


async def submit(run: Run, http: httpx.AsyncClient) -> None:
    payload = {"steps": max(1, round(run.args.job_s / 0.5)), "step_s": 0.5}
    while run.unsent:
        key = run.unsent[0]
        try:
            reply = await http.post(
                "/v1/jobs",
                json={"resources": {"gpus": 1}, "payload": payload},
                headers={"Idempotency-Key": key},
            )
        except httpx.HTTPError:
            return  # down: sent again once it is back (the key makes it one job)
        if reply.status_code not in (200, 201):
            return
        run.keys[key] = reply.json()["id"]
        run.unsent.pop(0)


async def unfinished(http: httpx.AsyncClient) -> bool:
    try:
        page = (await http.get("/v1/queue")).json()
        running = (
            await http.get("/v1/jobs", params={"state": ["running", "placed"], "limit": 500})
        ).json()
    except httpx.HTTPError:
        return True
    return bool(page["total"] or running["jobs"])


async def sample(run: Run, http: httpx.AsyncClient, *, up: bool) -> None:
    alive = set(machines(run))
    queued = active = None
    if up:
        try:
            queued = int((await http.get("/v1/queue")).json()["total"])
            nodes = (await http.get("/v1/nodes")).json()
            going = (
                await http.get("/v1/jobs", params={"state": ["running", "placed"], "limit": 500})
            ).json()
            active = queued + len(going["jobs"])
            run.joined = {n["name"] for n in nodes if n["state"] == "ready"}
            run.busy = {n["name"] for n in nodes if n.get("allocations")}
        except (httpx.HTTPError, KeyError, ValueError):
            queued = active = None
    joined = alive & run.joined  # while the server is down: as last seen
    run.samples.append(
        Sample(
            run.now(),
            queued,
            active,
            len(alive - joined),
            len(joined),
            len(joined - run.busy),
        )
    )


def machines(run: Run) -> list[str]:
    """The machines alive now, from the provider's own records (no lag)."""
    if not run.provider_dir.exists():
        return []
    return [m["name"] for m in provider_module().State(run.provider_dir).members()]


_PROVIDER: list[ModuleType] = []


def provider_module() -> ModuleType:
    if not _PROVIDER:
        spec = importlib.util.spec_from_file_location("local_provider", EXAMPLE)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _PROVIDER.append(module)
    return _PROVIDER[0]


def stop_machines(run: Run) -> None:
    names = machines(run)
    if names:
        provider_module().terminate(provider_module().State(run.provider_dir), names)


async def audit(run: Run, http: httpx.AsyncClient) -> dict[str, int]:
    wanted = set(run.keys.values())
    done: set[str] = set()
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500, "state": "succeeded"}
        page = await http.get("/v1/jobs", params=params | ({"cursor": cursor} if cursor else {}))
        body = page.json()
        done |= {j["id"] for j in body["jobs"]}
        cursor = body["next_cursor"]
        if not cursor:
            break
    counts: dict[str, int] = {}
    for line in (await http.get("/v1/events/export")).text.splitlines():
        event = json.loads(line)
        if event["kind"] == "job.succeeded":
            counts[event["job_id"]] = counts.get(event["job_id"], 0) + 1
    launches = 0
    for line in (await http.get("/v1/events/export")).text.splitlines():
        launches += json.loads(line)["kind"] == "node.launched"
    return {
        "submitted": len(run.keys) + len(run.unsent),
        "completed": len(wanted & done),
        "lost": len(wanted - done) + len(run.unsent),
        "twice": sum(1 for n in counts.values() if n > 1),
        "launches": launches,
    }


def run_overspend(run: Run) -> float:
    """Machine-seconds beyond ``max_nodes``: every machine alive counts, joined or not."""
    return integral(run, lambda s: max(0, s.launching + s.running - run.args.max_nodes))


def integral(run: Run, value: Any) -> float:
    total = 0.0
    for before, after in zip(run.samples, run.samples[1:], strict=False):
        total += value(before) * (after.t - before.t)
    return total


def report(run: Run) -> dict[str, Any]:
    a, audit_ = run.args, run.audit
    idle = integral(run, lambda s: s.idle)
    return {
        "jobs submitted": audit_["submitted"],
        "completed": audit_["completed"],
        "lost": audit_["lost"],
        "completed twice": audit_["twice"],
        "machines launched": audit_["launches"],
        "server kills": len(run.down),
        "server downtime": f"{sum(b - a_ for a_, b in run.down):.0f} s",
        "overspend": f"{run_overspend(run):.0f} machine-seconds beyond max_nodes {a.max_nodes}",
        "idle machine-seconds": f"{idle:.0f} (idle_s {a.idle_s:g}, scale_up_delay_s "
        f"{a.scale_up_delay_s:g})",
    }


def plot(run: Run, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, no display
    import matplotlib.pyplot as plt

    s, a = run.samples, run.args
    t = [x.t for x in s]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(t, [x.queued for x in s], label="work queued", color="tab:gray")
    wanted = [None if x.active is None else min(x.active, a.max_nodes) for x in s]
    ax.plot(t, wanted, label="machines wanted", color="tab:blue", linestyle="--")
    ax.plot(t, [x.launching for x in s], label="machines launching", color="tab:orange")
    ax.plot(t, [x.running for x in s], label="machines running", color="tab:green")
    ax.axhline(a.max_nodes, color="tab:red", linewidth=0.8, linestyle=":", label="max_nodes")
    for i, (start, end) in enumerate(run.down):
        ax.axvspan(start, end, color="tab:red", alpha=0.15, label="server down" if i == 0 else None)
    ax.set_xlabel("seconds")
    ax.set_ylabel("jobs / machines")
    ax.set_title(
        f"autoscaler under chaos: list lags {a.lag_s:g} s, server killed {len(run.down)}x, "
        f"overspend {run_overspend(run):.0f} machine-s"
    )
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
