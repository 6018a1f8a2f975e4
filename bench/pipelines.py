"""A pipeline step's input handover: on the machine that made the file, or through the server.

Starts ``corral server`` and two ``corral agent`` processes (box-a, box-b) whose command
steps write a file of ``--mib`` MiB or read their inputs, then runs ``--runs`` two-step
pipelines (encode writes the file, decode reads it) in two ways and prints, for each,
the median time from decode entering the queue (``job.queued``) to its start
(``job.started``: its input is on local disk by then), and from encode's end to
decode entering the queue (the release pass):

* ``same machine``: decode has no selector, so it is held near encode's file and runs
  on box-a, taking the file as a hard link of the agent's own copy;
* ``other machine``: decode selects box-b, so the file goes box-a -> server -> box-b.

    python bench/pipelines.py --mib 64 --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

ADMIN = "corral_admin_pipeline-bench-admin-token-01234567"
CLI = "from corral.cli.main import main; main()"
T = TypeVar("T")
STEP = textwrap.dedent(
    """
    import json, os, pathlib
    payload = json.loads(os.environ["CORRAL_PAYLOAD"])
    out = pathlib.Path(os.environ["CORRAL_OUTPUT_DIR"])
    if "mib" in payload:
        (out / "latent.bin").write_bytes(os.urandom(payload["mib"] << 20))
    for path in json.loads(os.environ["CORRAL_INPUTS"]).values():
        (out / "size.txt").write_text(str(pathlib.Path(path).stat().st_size))
    """
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64, help="the file encode makes, in MiB")
    p.add_argument("--runs", type=int, default=5, help="pipelines per way")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        base = start(Path(tmp), stack)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
            for way, selector in (
                ("same machine", {}),
                ("other machine", {"corral/node": "box-b"}),
            ):
                runs = [pipeline(http, args.mib, selector) for _ in range(args.runs)]
                handover = statistics.median(r[0] for r in runs) * 1000
                release = statistics.median(r[1] for r in runs) * 1000
                where = sorted({r[2] for r in runs})
                print(
                    f"{way:<14} {args.mib} MiB: queued -> started p50 {handover:.1f} ms, "
                    f"end -> queued p50 {release:.1f} ms (decode on {', '.join(where)})"
                )


def start(tmp: Path, stack: contextlib.ExitStack) -> str:
    """The server and both agents; the server's HTTP base URL."""
    http_port, agent_port = free_port(), free_port()
    env = {"CORRAL_ADMIN_TOKEN": ADMIN, "CORRAL_AGENTS__PORT": str(agent_port)}
    env |= {"CORRAL_SCHEDULING__DEBOUNCE_S": "0.001"}
    server = [*corral(), "server", "--home", str(tmp / "server"), "--port", str(http_port)]
    stack.callback(stop, spawn(server, tmp, "server", env))
    base = f"http://127.0.0.1:{http_port}"
    eventually(lambda: up(f"{base}/healthz"), 60, "the server")
    script = tmp / "step.py"
    script.write_text(STEP)
    for name in ("box-a", "box-b"):
        argv = [*corral(), "agent", "--server", f"grpc://127.0.0.1:{agent_port}", "--name", name]
        argv += ["--token", ADMIN, "--work-dir", str(tmp / name), "--cpus", "1"]
        argv += ["--command", f"{sys.executable} {script}"]
        stack.callback(stop, spawn(argv, tmp, name, {}))
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        eventually(lambda: len(http.get("/v1/nodes").json()) == 2, 60, "both agents")
    return base


def pipeline(http: httpx.Client, mib: int, selector: dict[str, str]) -> tuple[float, float, str]:
    """One encode -> decode run: (decode queued -> started, encode end -> decode queued, where
    decode ran)."""
    steps = {
        "encode": {
            "kind": "train",
            "payload": {"mib": mib},
            "node_selector": {"corral/node": "box-a"},
        },
        "decode": {
            "kind": "train",
            "node_selector": selector,
            "inputs": [{"from": "encode", "file": "latent.bin"}],
        },
    }
    made = http.post("/v1/pipelines", json={"steps": steps})
    made.raise_for_status()
    group = made.json()["id"]
    done = eventually(lambda: ended(http, group), 300, "the pipeline")
    assert done["state"] == "succeeded", done
    jobs = {j["pipeline"]["step"]: j for j in done["jobs"]}
    encode_end = event_at(http, jobs["encode"]["id"], "job.succeeded")
    queued = event_at(http, jobs["decode"]["id"], "job.queued")
    started = event_at(http, jobs["decode"]["id"], "job.started")
    size = http.get(f"/v1/jobs/{jobs['decode']['id']}/result/size.txt").text
    assert int(size) == mib << 20, size
    return started - queued, queued - encode_end, str(jobs["decode"]["node"])


def ended(http: httpx.Client, group: str) -> dict[str, Any] | None:
    body: dict[str, Any] = http.get(f"/v1/pipelines/{group}").json()
    return body if body["state"] != "running" else None


def event_at(http: httpx.Client, job_id: str, kind: str) -> float:
    """When the job's event ``kind`` happened (its stream, read to the job's end)."""
    with http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=30) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["kind"] == kind:
                    return float(event["at"])
    raise AssertionError(f"job {job_id} has no {kind} event")


def corral() -> list[str]:
    return [sys.executable, "-c", CLI]


def spawn(argv: list[str], tmp: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    log = (tmp / f"{name}.log").open("wb")
    return subprocess.Popen(argv, env=base | env, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
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


def up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def eventually(probe: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not ready within {timeout:.0f} s")
        time.sleep(0.05)
    return value


if __name__ == "__main__":
    main()
