"""A cluster for the drop-in API tests: server, one agent, and the reference backends.

Real processes on loopback: ``corral server`` (requests take one CPU slot, not a
GPU), the reference AUTOMATIC1111 (a tiny random diffusers pipeline on CPU) and
the reference ComfyUI as their own processes, and ``corral agent --a1111 URL
--comfyui URL`` with two CPU slots. Started once per test module.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from e2e_harness import ADMIN, Cluster, Proc

STEP_DELAY_S = "0.04"  # per sampling step: long requests can be watched and interrupted


@dataclass
class CompatCluster:
    cluster: Cluster
    a1111: str  # the reference backends' own URLs
    comfyui: str

    @property
    def http(self) -> str:
        return self.cluster.http

    @property
    def port(self) -> int:
        return self.cluster.http_port


def reference(cluster: Cluster, backend: str, *args: str) -> tuple[Proc, str]:
    """Start ``python -m corral.agent.reference <backend>``; its process and URL."""
    argv = [sys.executable, "-m", "corral.agent.reference", backend, "--port", "0", *args]
    proc = cluster._spawn(f"reference {backend}", argv, {})
    url = proc.wait_for(r"listening on (http://\S+)", timeout=90).group(1)
    return proc, url


def compat_cluster(tmp: Path) -> Iterator[CompatCluster]:
    """The whole cluster, stopped afterwards (its logs printed for a failing test)."""
    cluster = Cluster(tmp)
    try:
        _, a1111 = reference(cluster, "a1111", "--step-delay", STEP_DELAY_S)
        _, comfyui = reference(cluster, "comfyui", "--step-delay", STEP_DELAY_S)
        cluster.start_server(CORRAL_COMPAT__GPUS="0", CORRAL_COMPAT__CPUS="1")
        cluster.start_agent(
            "box", "--a1111", a1111, "--comfyui", comfyui, "--cpus", "2", token=ADMIN
        )
        yield CompatCluster(cluster, a1111, comfyui)
    finally:
        cluster.stop()
        print(cluster.logs())
