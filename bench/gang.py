"""Gangs of real ``torch.distributed`` ranks: how fast they start, how fast they come back.

Starts ``corral server`` and, on this machine, one ``corral agent`` per replica
started cold (each rank a fresh interpreter) and one per replica plus a spare
started warm (``--preload torch``: each rank forked from the agent's zygote),
each agent a "machine" taking one replica and running ``examples/ddp/train.py``
on gloo. It submits a short gang to the cold machines, then one to the warm
machines, then a long one to the warm machines, and prints

* ``placement -> all ranks in init_process_group``: from the ``job.placed``
  event to the last rank's join, cold and warm, and their ratio (goal: <= 2 s
  for 3 replicas);
* ``node loss -> training again``: once the long gang has checkpointed, one
  machine dies (its agent and every process under it, ``kill -9``); the time
  from then to the first step of the next attempt, on the survivors and the
  spare (goal: <= node_timeout + 10 s);
* ``lost steps``: steps run again after the loss (done after the checkpoint
  the gang resumed from), as a share of all steps run.

    python bench/gang.py --replicas 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from corral.agent.vram_guard import process_tree

ADMIN = "corral_admin_gang-bench-admin-token-0123456789"
CLI = "from corral.cli.main import main; main()"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp" / "train.py"
T = TypeVar("T")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--node-timeout", type=float, default=5.0)
    p.add_argument("--work-dir", type=Path, help="keep the logs here (default: removed)")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        tmp.mkdir(parents=True, exist_ok=True)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            run(args, tmp, procs)
        finally:
            for proc in reversed(procs):
                stop(proc)


def run(args: argparse.Namespace, tmp: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    http_port, agent_port = free_port(), free_port()
    env = {"CORRAL_ADMIN_TOKEN": ADMIN, "CORRAL_AGENTS__PORT": str(agent_port)}
    env |= {"CORRAL_SCHEDULING__LIVENESS_TICK_S": "0.2", "CORRAL_SCHEDULING__DEBOUNCE_S": "0.001"}
    env |= {"CORRAL_SCHEDULING__RETRY_BACKOFF_S": "0.1"}
    server = [*corral(), "server", "--home", str(tmp / "server"), "--port", str(http_port)]
    procs.append(spawn([*server, "--node-timeout", str(args.node_timeout)], tmp, "server", env))
    base = f"http://127.0.0.1:{http_port}"
    eventually(lambda: up(f"{base}/healthz"), 60, "the server")  # agents then dial at once
    grpc = f"grpc://127.0.0.1:{agent_port}"
    cold = start_agents(grpc, tmp, "cold", args.replicas, procs)
    warm = start_agents(grpc, tmp, "warm", args.replicas + 1, procs)  # one spare, to come back on
    with httpx.Client(
        base_url=base,
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    ) as c:
        eventually(lambda: ready_nodes(c) == len(cold) + len(warm), 60, "every agent connected")
        eventually(lambda: all(preloaded(tmp, name) for name in warm), 120, "warm zygotes")
        starts = {kind: start_time(c, args, tmp, kind) for kind in ("cold", "warm")}
        ledger = tmp / "ledger"
        job_id = submit(c, args, ledger, "warm", args.steps, max_attempts=5)
        saved = eventually(lambda: checkpointed(c, job_id), 120, "a checkpoint")
        victim = eventually(lambda: replica_node(c, job_id, 1), 10, "replica 1's node")
        lost_at = time.time()
        lose_machine(warm[victim])
        done = eventually(lambda: finished(c, job_id), 600, "the gang's end")
    report(args, starts, read_ledger(ledger), lost_at, saved, done)


def start_agents(
    grpc: str, tmp: Path, kind: str, count: int, procs: list[subprocess.Popen[bytes]]
) -> dict[str, subprocess.Popen[bytes]]:
    """``count`` agents (machines) named ``<kind>-<i>`` and labelled ``start=<kind>``; the
    warm ones fork their ranks from a zygote that has imported torch."""
    agents = {}
    for i in range(count):
        name = f"{kind}-{i}"
        argv = [*corral(), "agent", "--server", grpc, "--name", name, "--token", ADMIN]
        argv += ["--work-dir", str(tmp / name), "--cpus", "1", "--label", f"start={kind}"]
        argv += ["--command", f"{sys.executable} {EXAMPLE}"]
        argv += ["--preload", "torch"] if kind == "warm" else []
        agents[name] = spawn(argv, tmp, name, {})
        procs.append(agents[name])
    return agents


def start_time(c: httpx.Client, args: argparse.Namespace, tmp: Path, kind: str) -> float:
    """A short gang on the ``kind`` machines: seconds from its placement to its last join."""
    ledger = tmp / f"ledger-{kind}"
    job_id = submit(c, args, ledger, kind, 2, max_attempts=1)
    done = eventually(lambda: finished(c, job_id), 300, f"the {kind} gang's end")
    if done["state"] != "succeeded":
        raise SystemExit(f"the {kind} gang ended {done['state']}: {done.get('error')}")
    placed = min(e["at"] for e in events(c, job_id) if e["kind"] == "job.placed")
    return max(at for what, _, _, at in read_ledger(ledger) if what == "join") - placed


def preloaded(tmp: Path, agent: str) -> bool:
    return "preloaded torch" in (tmp / f"{agent}.log").read_text(errors="replace")


def submit(
    c: httpx.Client, args: argparse.Namespace, ledger: Path, kind: str, steps: int, **spec: Any
) -> str:
    train = ["--steps", str(steps), "--step-s", str(args.step_s), "--ledger", str(ledger)]
    train += ["--checkpoint-every", str(args.checkpoint_every)]
    job = {"kind": "train", "replicas": args.replicas, "resources": {"cpus": 1}}
    job |= {"payload": {"args": train}, "node_selector": {"start": kind}, **spec}
    reply = c.post("/v1/jobs", json=job)
    reply.raise_for_status()
    return str(reply.json()["id"])


def report(
    args: argparse.Namespace,
    starts: dict[str, float],
    ledger: list[tuple[str, int, int, float]],
    lost_at: float,
    saved: int,
    done: dict[str, Any],
) -> None:
    steps = [(attempt, n, at) for what, attempt, n, at in ledger if what == "step"]
    again = min(at for attempt, _, at in steps if attempt > 1)
    run_steps = len(steps)
    print(f"gang of {args.replicas}: {done['state']} after {done['attempt']} attempts")
    cold, warm = starts["cold"], starts["warm"]
    print(
        f"placement -> all ranks in init_process_group: cold {cold:.2f} s, warm {warm:.2f} s "
        f"(warm/cold {warm / cold:.2f})"
    )
    print(
        f"node loss -> training again: {again - lost_at:.2f} s "
        f"(node_timeout {args.node_timeout:g} s; checkpoint at step {saved}, "
        f"resumed from step {done['resumed_from_step']})"
    )
    lost = run_steps - args.steps
    print(f"lost steps: {lost} of {run_steps} run ({lost / run_steps:.1%})")


def read_ledger(path: Path) -> list[tuple[str, int, int, float]]:
    rows = (line.split() for line in path.read_text().splitlines())
    return [(what, int(attempt), int(n), float(at)) for what, attempt, n, at in rows]


def up(url: str) -> bool:
    return httpx.get(url, timeout=2).status_code == 200


def ready_nodes(c: httpx.Client) -> int:
    return sum(n["state"] == "ready" for n in c.get("/v1/nodes").json())


def checkpointed(c: httpx.Client, job_id: str) -> int:
    return int(c.get(f"/v1/jobs/{job_id}").json().get("checkpoint_step") or 0)


def replica_node(c: httpx.Client, job_id: str, replica: int) -> str | None:
    for node in c.get("/v1/nodes").json():
        for alloc in node["allocations"]:
            if job_id in alloc["job_ids"] and alloc["replica"] == replica:
                return str(node["name"])
    return None


def finished(c: httpx.Client, job_id: str) -> dict[str, Any] | None:
    job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
    return job if job["state"] in ("succeeded", "failed", "cancelled") else None


def events(c: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    """The job's events (its SSE stream, read until it goes quiet)."""
    out: list[dict[str, Any]] = []
    with (
        contextlib.suppress(httpx.ReadTimeout),
        c.stream("GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(10, read=1.0)) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[len("data: ") :]))
    return out


def lose_machine(agent: subprocess.Popen[bytes]) -> None:
    """The machine dies: the agent and every process under it, at once."""
    doomed = [agent.pid, *(process_tree(agent.pid) - {agent.pid})]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    agent.wait(10)


def corral() -> list[str]:
    return [sys.executable, "-c", CLI]


def spawn(argv: list[str], tmp: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    with (tmp / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            argv, env=base | env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eventually(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            value = probe()
            if value:
                return value
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
