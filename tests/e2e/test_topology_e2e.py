"""GPU topology end to end: an agent reports how its (fake) GPUs sit, a two-GPU job gets
the NVLink pair, and its process runs pinned to those GPUs' NUMA node's CPUs."""

from __future__ import annotations

import os

import pytest
from e2e_harness import Cluster, submit, wait_state

pytestmark = pytest.mark.slow

WHERE = 'echo "$CUDA_VISIBLE_DEVICES $CORRAL_CPUS" > "$CORRAL_OUTPUT_DIR/where.txt"'


def test_a_two_gpu_job_gets_the_nvlink_pair_and_its_numa_nodes_cpus(cluster: Cluster) -> None:
    cpu = max(os.sched_getaffinity(0))
    layout = f"numa=0,0,1,1; nvlink=2-3; cpus=0:{min(os.sched_getaffinity(0))},1:{cpu}"
    cluster.start_server()
    cluster.start_agent(
        "box",
        *("--fake-gpus", "4x A100 80GiB", "--fake-topology", layout),
        *("--command", f"sh -c '{WHERE}'"),
    )
    with cluster.client() as c:
        gpus = c.get("/v1/nodes/box").json()["gpus"]
        assert [g["numa"] for g in gpus] == [0, 0, 1, 1]
        assert gpus[2]["links"] == ["cross_socket", "cross_socket", "", "nvlink"]
        # one CPU on each NUMA node: the agent's slots split between them
        numa = c.get("/v1/nodes/box").json()["numa_cpus"]
        slots = c.get("/v1/nodes/box").json()["cpus"]
        assert set(numa) == {"0", "1"}
        assert sum(numa.values()) == pytest.approx(slots)
        j = submit(c, kind="train", resources={"gpus": 2})
        done = wait_state(c, j["id"], "succeeded", "failed", timeout=30)
        assert done["state"] == "succeeded", done
        where = c.get(f"/v1/jobs/{j['id']}/result/where.txt").text.split()
    assert where == ["2,3", str(cpu)]
