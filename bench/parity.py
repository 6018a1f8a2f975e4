"""Parity: one scenario run by ``corral sim`` and by a real server with ``--fake-gpus`` agents.

The simulator is only useful if it tells what the server would do. This runs
a scenario file both ways and compares the outcomes:

* ``corral sim`` (``corral.sim.simulate``) on virtual time;
* ``corral server`` and one ``corral agent --fake-gpus`` per scenario node,
  all real processes on loopback, on wall-clock time. Each scenario job is
  submitted at its ``submit_at`` (seconds after the cluster is ready) as the
  demo executor's job, whose run time the scenario sets: ``duration / STEP_S``
  steps of ``STEP_S`` seconds (a job without a duration runs past the end);
  the jobs due at one instant are one batch (``POST /v1/jobs/batch``).
  The demo checkpoints when preempted and resumes from its step, as the
  simulator assumes every job does. The server's minimum run time before
  preemption is the scenario's, and its idle cycle is longer than the run,
  so every cycle it runs is one it was woken for.

The outcome compared (``Outcome``) is, per group of interchangeable jobs (same
team, user, priority, size, gang, submission and duration: which of two
identical jobs the scheduler evicts is a tie, not a difference), the sorted
waits (submission to first placement), the states at ``until`` and the
preemptions; and per team the GPUs held at ``until``. Waits agree within
``--tolerance`` seconds (default ``TOLERANCE_S``): the server starts work on
an agent over the network, and a preemption waits for the victim's agent to
stop it, where the simulator does both at once.

    python bench/parity.py tests/sim/scenarios/parity_reclaim.yaml [--tolerance 1.0]

prints both outcomes side by side and ``parity: ok`` or the differences (exit
status 1). Scenarios must be short in wall time (``until`` seconds of it).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from corral.sim.loaders import load_scenario
from corral.sim.runner import simulate
from corral.sim.scenario import Scenario, SimJob

ADMIN = "corral_admin_parity-bench-admin-token"
STEP_S = 0.1  # the demo's step: a preempted job resumes from its last step, so it loses < 0.1 s
MAX_STEPS = 500  # the demo's limit: jobs run at most 50 s
TOLERANCE_S = 1.0  # placement over the network + a victim's agent stopping it, generously
T = TypeVar("T")

Signature = tuple[str, str, str, float, int, float, float | None]


@dataclass
class Outcome:
    """What a run did, in terms both runs share."""

    waits: dict[Signature, list[float | None]] = field(default_factory=dict)
    states: dict[Signature, list[str]] = field(default_factory=dict)
    preempted: dict[Signature, int] = field(default_factory=dict)
    held: dict[str, float] = field(default_factory=dict)  # team -> GPUs held at the end

    @property
    def preemptions(self) -> int:
        return sum(self.preempted.values())


def signature(sim_job: SimJob) -> Signature:
    """What makes two jobs interchangeable for the comparison."""
    job = sim_job.job
    return (
        job.team,
        job.user,
        job.priority,
        _gpus(sim_job),
        job.replicas,
        job.submitted_at,
        sim_job.duration,
    )


def _gpus(sim_job: SimJob) -> float:
    """GPUs per replica: whole cards, or the share of one."""
    r = sim_job.job.resources
    return float(r.gpus) if r.gpus else r.gpu_milli / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE_S, help="seconds")
    parser.add_argument("--keep", type=Path, help="keep the server's and agents' files here")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    sim = sim_outcome(scenario)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        real = server_outcome(scenario, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="corral-parity-") as tmp:
            real = server_outcome(scenario, Path(tmp))
    print_side_by_side(sim, real)
    differences = compare(sim, real, args.tolerance)
    for line in differences:
        print(f"differs: {line}")
    print("parity: ok" if not differences else f"parity: {len(differences)} differences")
    return 1 if differences else 0


# -- the simulator ------------------------------------------------------------------------


def sim_outcome(scenario: Scenario) -> Outcome:
    """``corral sim`` on ``scenario``, up to its ``until``."""
    records: list[dict[str, Any]] = []
    simulate(scenario, "corral", sink=lambda r: records.append(r.as_dict()))
    by_id = {sj.job.id: sj for sj in scenario.jobs()}
    out = Outcome()
    for rec in records:
        sig = signature(by_id[rec["id"]])
        out.waits.setdefault(sig, []).append(rec["wait_s"])
        state = {"succeeded": "done", "placed": "running"}.get(rec["state"], rec["state"])
        out.states.setdefault(sig, []).append(state)
        # a gang's replicas are preempted together: one preemption per instant
        stops = {p["end"] for p in rec["placements"] if p.get("preempted")}
        out.preempted[sig] = out.preempted.get(sig, 0) + len(stops)
        held = sum(p["gpus"] for p in rec["placements"] if p["end"] is None)
        out.held[rec["team"]] = out.held.get(rec["team"], 0.0) + held
    return _sorted(out)


def _sorted(out: Outcome) -> Outcome:
    for waits in out.waits.values():
        waits.sort(key=lambda w: (w is None, w or 0.0))
    for states in out.states.values():
        states.sort()
    return out


# -- the real server ----------------------------------------------------------------------


def server_outcome(scenario: Scenario, tmp: Path) -> Outcome:
    """A real server and agents run ``scenario`` for ``until`` seconds of wall time."""
    if scenario.until is None:
        raise SystemExit("parity: the scenario needs an `until` (seconds of wall time)")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        url, agents_url = start_server(scenario, tmp, procs)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            for node in scenario.nodes:
                procs.append(start_agent(node, agents_url, tmp))
            names = {node.name for node in scenario.nodes}
            eventually(lambda: ready(c) >= names, 60, "every agent connected")
            for team in scenario.teams:
                body = {
                    "quota_gpus": team.quota_gpus,
                    "borrow_limit_gpus": team.borrow_limit_gpus,
                    "weight": team.weight,
                }
                c.put(f"/v1/teams/{team.name}", json=body).raise_for_status()
            ids = submit_on_time(c, scenario)
            return collect(c, scenario, ids)
    finally:
        for proc in reversed(procs):
            stop(proc)


def start_server(
    scenario: Scenario, tmp: Path, procs: list[subprocess.Popen[bytes]]
) -> tuple[str, str]:
    """``corral server`` on free ports: its HTTP and agent addresses."""
    config = scenario.config
    env = {
        "CORRAL_ADMIN_TOKEN": ADMIN,
        "CORRAL_SCHEDULING__MIN_RUNTIME_BEFORE_PREEMPTION_S": str(
            config.min_runtime_before_preemption_s
        ),
        "CORRAL_SCHEDULING__PREEMPTION": "true" if config.preemption else "false",
        "CORRAL_SCHEDULING__IDLE_CYCLE_S": str(max(600.0, 10 * (scenario.until or 0))),
        "CORRAL_SCHEDULING__DEBOUNCE_S": "0.001",
        "CORRAL_SCHEDULING__PREEMPTION_GRACE_S": "5",
        "CORRAL_SCHEDULING__LIVENESS_TICK_S": "0.2",
    }
    http, agents = free_port(), free_port()
    argv = [*corral(), "server", "--home", str(tmp / "server"), "--port", str(http)]
    argv += ["--agent-port", str(agents), "--node-timeout", "30"]
    procs.append(spawn(argv, tmp / "server.log", env))
    url = f"http://127.0.0.1:{http}"
    eventually(lambda: _up(url), 60, "the server answering")
    return url, f"grpc://127.0.0.1:{agents}"


def start_agent(node: Any, agents_url: str, tmp: Path) -> subprocess.Popen[bytes]:
    gpu = node.gpus[0] if node.gpus else None
    argv = [*corral(), "agent", "--server", agents_url, "--name", node.name, "--token", ADMIN]
    argv += ["--work-dir", str(tmp / node.name), "--cpus", str(node.cpus)]
    if gpu is not None:
        vram = max(1, gpu.vram_bytes // 2**30)
        argv += ["--fake-gpus", f"{len(node.gpus)}x {gpu.model} {vram}GiB"]
    return spawn(argv, tmp / f"{node.name}.log", {})


def submit_on_time(c: httpx.Client, scenario: Scenario) -> dict[str, str]:
    """Submit the jobs due at each ``submit_at`` (seconds after now) together, in one batch
    (one transaction, as the simulator has them arrive in one instant, so one cycle sees
    them all); scenario id -> server id."""
    ids: dict[str, str] = {}
    start = time.monotonic()
    due: dict[float, list[SimJob]] = defaultdict(list)
    for sim_job in scenario.jobs():
        due[sim_job.job.submitted_at].append(sim_job)
    for at in sorted(due):
        delay = start + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        jobs = due[at]
        reply = c.post("/v1/jobs/batch", json={"jobs": [job_spec(sj) for sj in jobs]})
        if reply.status_code != 201:
            raise SystemExit(f"parity: the server refused the jobs due at {at:g} s: {reply.text}")
        for sim_job, made in zip(jobs, reply.json()["jobs"], strict=True):
            ids[sim_job.job.id] = made["id"]
    left = start + (scenario.until or 0) - time.monotonic()
    if left > 0:
        time.sleep(left)
    return ids


def job_spec(sim_job: SimJob) -> dict[str, Any]:
    """The demo job that runs as long as ``sim_job`` (its duration; none: past the end)."""
    job, r = sim_job.job, sim_job.job.resources
    steps = MAX_STEPS if sim_job.duration is None else round(sim_job.duration / STEP_S)
    if not 1 <= steps <= MAX_STEPS:
        raise SystemExit(f"parity: {job.id}: duration must be {STEP_S}..{MAX_STEPS * STEP_S} s")
    resources: dict[str, Any] = {"gpus": _gpus(sim_job), "cpus": r.cpus}
    if r.vram_bytes:
        resources["vram"] = r.vram_bytes
    if r.gpu_models:
        resources["gpu_models"] = sorted(r.gpu_models)
    return {
        "payload": {
            "prompt": job.id,
            "steps": steps,
            "step_s": STEP_S,
            "preview_every": 0,
            "size": 8,
        },
        "resources": resources,
        "team": job.team,
        "user": job.user,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "replicas": job.replicas,
        "max_attempts": 100,
    }


def collect(c: httpx.Client, scenario: Scenario, ids: dict[str, str]) -> Outcome:
    """The outcome from the server's event log and jobs, read at ``until``."""
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with c.stream("GET", "/v1/events/export", timeout=30) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line:
                event = __import__("json").loads(line)
                if event.get("job_id"):
                    events[event["job_id"]].append(event)
    out = Outcome()
    for sim_job in scenario.jobs():
        server_id = ids[sim_job.job.id]
        sig = signature(sim_job)
        mine = events[server_id]
        submitted = next(e["at"] for e in mine if e["kind"] == "job.submitted")
        placed = [e["at"] for e in mine if e["kind"] == "job.placed"]
        out.waits.setdefault(sig, []).append(placed[0] - submitted if placed else None)
        job = c.get(f"/v1/jobs/{server_id}").raise_for_status().json()
        state = {"succeeded": "done", "placed": "running"}.get(job["state"], job["state"])
        out.states.setdefault(sig, []).append(state)
        gone = len({e["at"] for e in mine if e["kind"] == "job.preempted"})  # a gang's: one
        out.preempted[sig] = out.preempted.get(sig, 0) + gone
        if state == "running":
            held = _gpus(sim_job) * sim_job.job.replicas
            out.held[sim_job.job.team] = out.held.get(sim_job.job.team, 0.0) + held
        else:
            out.held.setdefault(sim_job.job.team, 0.0)
    return _sorted(out)


# -- comparing ----------------------------------------------------------------------------


def compare(sim: Outcome, real: Outcome, tolerance_s: float) -> list[str]:
    """The differences beyond ``tolerance_s`` (empty: the runs agree)."""
    out: list[str] = []
    for sig in sorted(set(sim.waits) | set(real.waits), key=str):
        name = _name(sig)
        a, b = sim.waits.get(sig, []), real.waits.get(sig, [])
        if len(a) != len(b) or any(
            not _close(x, y, tolerance_s) for x, y in zip(a, b, strict=True)
        ):
            out.append(f"{name}: waits sim {_fmt(a)} server {_fmt(b)}")
        if sim.states.get(sig) != real.states.get(sig):
            out.append(f"{name}: states sim {sim.states.get(sig)} server {real.states.get(sig)}")
        if sim.preempted.get(sig, 0) != real.preempted.get(sig, 0):
            out.append(
                f"{name}: preemptions sim {sim.preempted.get(sig, 0)} "
                f"server {real.preempted.get(sig, 0)}"
            )
    for team in sorted(set(sim.held) | set(real.held)):
        if abs(sim.held.get(team, 0.0) - real.held.get(team, 0.0)) > 1e-9:
            out.append(
                f"team {team}: GPUs held sim {sim.held.get(team)} server {real.held.get(team)}"
            )
    return out


def print_side_by_side(sim: Outcome, real: Outcome) -> None:
    print(
        f"{'jobs (team/user/priority/gpus/replicas/submit/duration)':58} {'sim':>24} {'server':>24}"
    )
    for sig in sorted(set(sim.waits) | set(real.waits), key=str):
        print(
            f"{_name(sig) + ' waits':58} {_fmt(sim.waits.get(sig, [])):>24} "
            f"{_fmt(real.waits.get(sig, [])):>24}"
        )
        print(
            f"{_name(sig) + ' preempted':58} {sim.preempted.get(sig, 0):>24} "
            f"{real.preempted.get(sig, 0):>24}"
        )
    for team in sorted(set(sim.held) | set(real.held)):
        print(
            f"{'team ' + team + ' GPUs held at the end':58} {sim.held.get(team, 0):>24g} "
            f"{real.held.get(team, 0):>24g}"
        )
    print(f"{'preemptions':58} {sim.preemptions:>24} {real.preemptions:>24}")


def _name(sig: Signature) -> str:
    team, user, priority, gpus, replicas, submit, duration = sig
    size = f"{replicas}x{gpus:g}" if replicas > 1 else f"{gpus:g}"
    return f"{team}/{user}/{priority}/{size} GPU @{submit:g}s/{duration if duration else '-'}"


def _close(x: float | None, y: float | None, tolerance_s: float) -> bool:
    if x is None or y is None:
        return x is y
    return abs(x - y) <= tolerance_s


def _fmt(waits: list[float | None]) -> str:
    return ",".join("-" if w is None else f"{w:.1f}" for w in waits)


# -- processes ----------------------------------------------------------------------------


def corral() -> list[str]:
    return [sys.executable, "-c", "from corral.cli.main import main; main()"]


def spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=base | {"PYTHONUNBUFFERED": "1"} | env, stdout=out, stderr=subprocess.STDOUT
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def ready(c: httpx.Client) -> set[str]:
    try:
        nodes = c.get("/v1/nodes").json()
    except httpx.HTTPError:
        return set()
    return {n["name"] for n in nodes if n.get("state") == "ready"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def eventually(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"parity: {what}: not within {timeout:g} s")
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
