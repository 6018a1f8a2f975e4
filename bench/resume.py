"""Resumable sampling under kill -9: how much work a lost machine costs a ComfyUI sample.

Two machines, each a reference ComfyUI (``python -m corral.agent.reference``) and a
``corral agent`` driving it, and one ``corral server``. Each job samples a
``--steps``-step txt2img graph (its own seed) with segments sized by the job's
checkpoint policy (``checkpoint_every_s``) at the step time the agent measured.
While it samples, the machine running it is killed (agent and backend, ``kill -9``)
at a random step (past the first quarter, so there is a checkpoint to lose
work from); the job resumes on the other machine from its last uploaded
latent, and the killed machine comes back. Printed:

* ``work redone``: steps sampled twice (the step the server last showed before
  the kill, minus the step the next attempt resumed from), as a share of all steps;
* ``identical results``: final images equal to an uninterrupted run of the same
  graph, pixel for pixel;
* ``kill to sampling again``: from the kill to the new attempt's first progress,
  against ``node_timeout + 5 s``.

    python bench/resume.py                      # 20 jobs of 40 steps
    python bench/resume.py --jobs 2 --steps 12  # the smoke run the tests use
"""

from __future__ import annotations

import argparse
import io
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from chaos_cluster import ADMIN, CLI, Proc, free_port
from chaos_cluster import _env as clean_env
from PIL import Image

from corral.agent.reference.comfyui import txt2img_workflow


def wait_line(proc: Proc, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        match = re.search(pattern, text)
        if match:
            return match
        if not proc.alive:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} never printed {pattern!r}\n{proc.tail()}")


class Machine:
    """A reference ComfyUI and the agent driving it: killed and brought back together."""

    def __init__(self, name: str, tmp: Path, grpc: str, step_s: float) -> None:
        self.name = name
        self.step_s = step_s
        self.tmp = tmp
        self.grpc = grpc
        self.url = ""
        self.comfy: Proc | None = None
        self.agent: Proc | None = None
        self.boots = 0

    def start(self) -> None:
        self.boots += 1
        port = free_port()
        argv = [sys.executable, "-m", "corral.agent.reference", "comfyui", "--port", str(port)]
        argv += ["--step-delay", str(self.step_s), "--preview-method", "none"]
        log = self.tmp / f"{self.name}-comfy-{self.boots}.log"
        self.comfy = Proc(f"{self.name} comfyui", argv, clean_env(), log)
        self.comfy.start()
        self.url = wait_line(self.comfy, r"listening on (http://\S+)").group(1)
        argv = [sys.executable, "-c", CLI, "agent", "--server", self.grpc, "--name", self.name]
        argv += ["--token", ADMIN, "--work-dir", str(self.tmp / f"{self.name}-{self.boots}")]
        argv += ["--comfyui", self.url, "--cpus", "1"]
        log = self.tmp / f"{self.name}-agent-{self.boots}.log"
        self.agent = Proc(f"{self.name} agent", argv, clean_env(), log)
        self.agent.start()
        wait_line(self.agent, r"connected to grpc://")

    def kill9(self) -> None:
        for proc in (self.agent, self.comfy):
            if proc is not None:
                proc.kill9()


def pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB").tobytes()


def poll(probe: Any, timeout: float, what: str, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what} (last: {value})")


def one_job(
    http: httpx.Client, machines: dict[str, Machine], seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Submit, kill its machine at a random step, follow it to its end; its figures."""
    graph = txt2img_workflow(f"sample {seed}", steps=args.steps, seed=seed, size=64)
    payload = {"workflow": graph, "checkpoint_every_s": args.segment_s}
    spec = {"kind": "sample", "backend": "comfyui", "payload": payload, "max_attempts": 5}
    spec["resources"] = {"gpus": 0, "cpus": 1}
    job_id = http.post("/v1/jobs", json=spec).json()["id"]
    kill_at = random.Random(seed).randint(max(2, args.steps // 4), args.steps - 2)

    def view() -> dict[str, Any]:
        data: dict[str, Any] = http.get(f"/v1/jobs/{job_id}").json()
        return data

    def at_kill_step() -> dict[str, Any] | None:
        j = view()
        if j["state"] in ("succeeded", "failed", "cancelled"):
            raise RuntimeError(f"job {job_id} ended before step {kill_at}: {j}")
        return j if j["state"] == "running" and j["progress"] * args.steps >= kill_at else None

    try:
        shown = poll(at_kill_step, 120, f"job {job_id} at step {kill_at}")
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}: {view()}") from None
    victim = machines[shown["node"]]
    killed_step = round(shown["progress"] * args.steps)
    victim.kill9()
    killed = time.monotonic()
    again = poll(
        lambda: (j := view())["attempt"] >= 2 and j["state"] == "running" and j,
        120,
        f"job {job_id} running again",
    )
    resumed = again.get("resumed_from_step") or 0
    poll(lambda: view()["progress"] * args.steps >= resumed and view()["node"], 60, "progress")
    back = time.monotonic() - killed
    victim.start()  # the machine comes back, empty
    done = poll(lambda: (j := view())["state"] in ("succeeded", "failed") and j, 120, "the end")
    if done["state"] != "succeeded":
        raise RuntimeError(f"job {job_id} failed: {done.get('error')}")
    name = next(r["name"] for r in done["result"] if r["name"].endswith(".png"))
    image = pixels(http.get(f"/v1/jobs/{job_id}/result/{name}").content)
    print(
        f"  {job_id}: killed at step {killed_step} on {shown['node']} (checkpoint "
        f"{shown.get('checkpoint_step')}), resumed from step {resumed} on {again['node']}",
        flush=True,
    )
    return {
        "graph": graph,
        "image": image,
        "redone": max(0, killed_step - resumed),
        "back_s": back,
        "resumed": resumed,
        "node": again["node"],
    }


def uninterrupted(url: str, graph: dict[str, Any]) -> bytes:
    with httpx.Client(base_url=url, timeout=30) as comfy:
        prompt_id = comfy.post("/prompt", json={"prompt": graph}).json()["prompt_id"]
        entry = poll(lambda: comfy.get(f"/history/{prompt_id}").json().get(prompt_id), 120, "run")
        ref = entry["outputs"]["9"]["images"][0]
        return pixels(comfy.get("/view", params=ref).content)


def run(args: argparse.Namespace, tmp: Path) -> int:
    argv = [sys.executable, "-c", CLI, "server", "--home", str(tmp / "server"), "--port", "0"]
    argv += ["--node-timeout", str(args.node_timeout)]
    env = clean_env(
        CORRAL_ADMIN_TOKEN=ADMIN,
        CORRAL_SCHEDULING__LIVENESS_TICK_S="0.2",
        CORRAL_SCHEDULING__RETRY_BACKOFF_S="0.1",
    )
    server = Proc("server", argv, env, tmp / "server.log")
    server.start()
    machines: dict[str, Machine] = {}
    try:
        url = wait_line(server, r"listening on (http://\S+)").group(1)
        grpc = wait_line(server, r"--server (grpc://\S+)").group(1)
        for name in ("box-a", "box-b"):
            machines[name] = Machine(name, tmp, grpc, args.step_s)
            machines[name].start()
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            runs = [one_job(http, machines, 1000 + i, args) for i in range(args.jobs)]
        reference = machines["box-a"].url
        same = sum(r["image"] == uninterrupted(reference, r["graph"]) for r in runs)
    finally:
        for machine in machines.values():
            machine.kill9()
        server.kill9()
    redone = sum(r["redone"] for r in runs) / (args.jobs * args.steps)
    backs = [r["back_s"] for r in runs]
    goal = args.node_timeout + 5
    print(f"jobs: {args.jobs} of {args.steps} steps, one kill -9 each at a random step")
    print(f"work redone: {redone:.1%} of the steps (goal <= 15%)")
    print(f"identical results: {same}/{args.jobs}")
    print(f"resumed from a checkpoint: {sum(r['resumed'] > 0 for r in runs)}/{args.jobs}")
    print(
        f"kill to sampling again: median {statistics.median(backs):.1f} s, "
        f"max {max(backs):.1f} s (goal under node_timeout + 5 s = {goal:g} s)"
    )
    return 0 if same == args.jobs else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per sampling step")
    parser.add_argument("--segment-s", type=float, default=0.5, help="the jobs' checkpoint_every_s")
    parser.add_argument("--node-timeout", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-resume-") as tmp:
        sys.exit(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
