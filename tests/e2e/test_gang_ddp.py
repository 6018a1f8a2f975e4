"""Multi-node training that really runs: gangs of ``torch.distributed`` ranks (gloo, CPU).

Each agent is a "machine" taking one replica; the example DDP script trains a
small model. The replicas find each other through the rank, world size and
master address corral hands them, and a gang that loses a machine mid-training
is stopped, requeued as one and resumed from rank 0's checkpoint, ending with
exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_harness import Cluster, events, eventually, job, wait_state
from gang_harness import lose_machine, reference, start_agents, submit_gang, weights

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_gang_trains_with_ddp_across_agents(
    cluster: Cluster, tmp_path: Path, replicas: int
) -> None:
    args = ("--steps", "20", "--checkpoint-every", "5")
    cluster.start_server()
    start_agents(cluster, *(f"box-{i}" for i in range(replicas)))
    with cluster.client() as c:
        j = submit_gang(c, replicas, *args)
        done = wait_state(c, j["id"], "succeeded", "failed", timeout=90)
        assert done["state"] == "succeeded", done
        got = weights(c, j["id"])
        node = c.get("/v1/nodes/box-1").json()
    assert node["labels"]["corral.address"] == "127.0.0.1", "reachable: the route to the server"
    assert got["weights"] == reference(tmp_path, replicas, *args)


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_warm_started_gang_trains_as_a_cold_one(
    cluster: Cluster, tmp_path: Path, replicas: int
) -> None:
    """Agents with ``--preload torch`` fork each rank from a zygote: the gang meets, trains
    and ends with the weights of ranks started by hand, and each rank's log says it was
    forked."""
    args = ("--steps", "10", "--checkpoint-every", "5")
    cluster.start_server()
    start_agents(cluster, *(f"box-{i}" for i in range(replicas)), warm=True)
    with cluster.client() as c:
        j = submit_gang(c, replicas, *args)
        done = wait_state(c, j["id"], "succeeded", "failed", timeout=90)
        assert done["state"] == "succeeded", done
        got = weights(c, j["id"])
        logs = [e["data"]["data"] for e in events(c, j["id"]) if e["data"]["kind"] == "job.log"]
        lines = [line for data in logs for line in data.get("lines", ())]
    assert got["weights"] == reference(tmp_path, replicas, *args)
    warm = [line for line in lines if line.endswith("started warm: forked with torch preloaded")]
    assert len(warm) == replicas, lines


def test_a_gang_that_loses_a_machine_resumes_from_its_checkpoint(
    cluster: Cluster, tmp_path: Path
) -> None:
    args = ("--steps", "60", "--checkpoint-every", "10", "--step-s", "0.1")
    cluster.start_server(node_timeout=2.0)
    agents = start_agents(cluster, "box-a", "box-b")
    with cluster.client() as c:
        j = submit_gang(c, 2, *args, max_attempts=5)
        saved = eventually(
            lambda: (job(c, j["id"]).get("checkpoint_step") or 0) >= 20 and job(c, j["id"]),
            60,
            "rank 0's checkpoint at step 20 or later",
        )
        lose_machine(agents["box-b"])
        start_agents(cluster, "box-c")
        done = wait_state(c, j["id"], "succeeded", "failed", timeout=120)
        assert done["state"] == "succeeded", done
        got = weights(c, j["id"])
    assert done["attempt"] == 2, "stopped and requeued as one"
    assert got["resumed_from"] == done["resumed_from_step"] >= saved["checkpoint_step"]
    assert got["weights"] == reference(tmp_path, 2, *args)
