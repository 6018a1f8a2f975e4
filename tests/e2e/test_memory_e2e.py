"""Memory requests end to end: a real server and a ``--fake-gpus`` agent offering 8 GiB.
A job asking for more than that waits with ``insufficient_memory``; one that fits runs and
its process is told its request (``CORRAL_MEMORY_BYTES``)."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_harness import Cluster, eventually, job, submit, wait_state

pytestmark = pytest.mark.slow

GIB = 1024**3
TELL = 'echo "$CORRAL_MEMORY_BYTES" > "$CORRAL_OUTPUT_DIR/memory.txt"'


def test_a_job_too_big_for_the_nodes_memory_waits_and_one_that_fits_runs(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    cluster.start_agent(
        "box",
        *("--fake-gpus", "2x RTX 4090 24GiB", "--memory", "8Gi"),
        *("--command", f"sh -c '{TELL}'"),
    )
    with cluster.client() as c:
        assert c.get("/v1/nodes/box").json()["memory_bytes"] == 8 * GIB
        big = submit(c, kind="train", resources={"gpus": 1, "memory": "12Gi"})

        def waiting() -> dict[str, Any] | None:
            queue = job(c, big["id"])["queue"]
            return queue if queue["reasons"] else None

        queue = eventually(waiting, what="the big job's reasons")
        assert [r["code"] for r in queue["reasons"]] == ["insufficient_memory"]
        assert "12 GiB" in queue["summary"]
        small = submit(c, kind="train", resources={"gpus": 1, "memory": "6Gi"})
        done = wait_state(c, small["id"], "succeeded", "failed", timeout=30)
        assert done["state"] == "succeeded", done
        told = c.get(f"/v1/jobs/{small['id']}/result/memory.txt").text.strip()
        assert told == str(6 * GIB)
        assert job(c, big["id"])["state"] == "queued"  # the node never has 12 GiB to give
