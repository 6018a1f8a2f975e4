"""Gangs of real ``torch.distributed`` ranks: the example DDP script, run through corral
or directly (the uninterrupted reference a gang's result must equal)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from e2e_harness import Cluster, Proc, submit

from corral.agent.vram_guard import process_tree

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp" / "train.py"
AGENT = ("--command", f"{sys.executable} {EXAMPLE}", "--cpus", "1")
"""An agent that runs train jobs as the example script, one replica at a time."""


WARM = ("--preload", "torch")
"""Its ranks forked from a zygote that has imported torch (warm start)."""


def start_agents(cluster: Cluster, *names: str, warm: bool = False) -> dict[str, Proc]:
    return {name: cluster.start_agent(name, *AGENT, *(WARM if warm else ())) for name in names}


def submit_gang(c: httpx.Client, replicas: int, *args: str, **spec: Any) -> dict[str, Any]:
    payload = {"args": list(args)}
    return submit(
        c, kind="train", replicas=replicas, resources={"cpus": 1}, payload=payload, **spec
    )


def weights(c: httpx.Client, job_id: str) -> dict[str, Any]:
    """Rank 0's summary of a finished gang: its weights, the step it resumed from."""
    reply = c.get(f"/v1/jobs/{job_id}/result/weights.json")
    reply.raise_for_status()
    data: dict[str, Any] = reply.json()
    return data


def reference(tmp: Path, replicas: int, *args: str) -> list[float]:
    """The weights of an uninterrupted run of ``replicas`` ranks started by hand."""
    out = tmp / f"reference-{replicas}"
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": str(replicas), "MASTER_ADDR": "127.0.0.1"}
    env |= {"MASTER_PORT": str(port), "CORRAL_OUTPUT_DIR": str(out)}
    env |= {"CORRAL_CHECKPOINT_DIR": str(out)}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(EXAMPLE), *args],
            env=env | {"RANK": str(rank)},
            stdout=subprocess.DEVNULL,
        )
        for rank in range(replicas)
    ]
    assert [p.wait(120) for p in ranks] == [0] * replicas
    summary: dict[str, Any] = json.loads((out / "weights.json").read_text())
    assert summary["resumed_from"] == 0
    return list(summary["weights"])


def lose_machine(agent: Proc) -> None:
    """The machine under ``agent`` dies: the agent and every process it started, at once."""
    doomed = process_tree(agent.popen.pid) - {agent.popen.pid}
    agent.kill9()
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):  # ended with its parent
            os.kill(pid, signal.SIGKILL)
