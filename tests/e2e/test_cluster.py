"""A real server and real agents over real gRPC on loopback, driven over HTTP.

Each test starts its own ``corral server`` (SQLite in a temp dir, a short
node timeout) and ``corral agent`` processes with the CPU demo executor, so
what is checked is exactly what a user runs.
"""

from __future__ import annotations

import pytest
from e2e_harness import Cluster, events, eventually, job, submit, wait_state

pytestmark = pytest.mark.slow

QUICK = {"steps": 6, "step_s": 0.05, "preview_every": 2}
LONG = {"steps": 400, "step_s": 0.05, "preview_every": 50}  # 20 s unless stopped


def test_jobs_run_on_two_agents_with_progress_and_previews_over_sse(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("a1", "--cpus", "1")
    cluster.start_agent("a2", "--cpus", "1")
    with cluster.client() as http:
        ids = [submit(http, payload={**QUICK, "prompt": f"p{i}"})["id"] for i in range(4)]
        done = [wait_state(http, i, "succeeded") for i in ids]
        assert {j["node"] for j in done} == {"a1", "a2"}  # one CPU slot each: both had to work
        kinds = [e["event"] for e in events(http, ids[0])]
        assert (kinds[0], kinds[-1]) == ("job.submitted", "job.succeeded"), kinds
        assert "job.started" in kinds
        assert "job.progress" in kinds
        assert "job.preview" in kinds
        preview = next(e for e in events(http, ids[0]) if e["event"] == "job.preview")
        image = http.get(preview["data"]["data"]["url"])
        assert image.status_code == 200
        assert image.content.startswith(b"\x89PNG")
        [result] = done[0]["result"]
        data = http.get(result["url"]).content
        assert data.startswith(b"\x89PNG")
        assert len(data) == result["size"]


def test_interrupt_keeps_the_picture_so_far_and_cancel_frees_the_node(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("a1", "--cpus", "1")
    with cluster.client() as http:
        first = submit(http, payload=LONG)["id"]
        eventually(lambda: job(http, first)["progress"] > 0.02, what="progress")
        assert http.post(f"/v1/jobs/{first}/interrupt").status_code == 200
        stopped = wait_state(http, first, "succeeded", "cancelled")
        assert stopped["state"] == "succeeded", stopped  # interrupted: what was made is kept
        assert [f["name"] for f in stopped["result"]] == ["image.png"]

        second = submit(http, payload=LONG)["id"]
        wait_state(http, second, "running")
        assert http.post(f"/v1/jobs/{second}/cancel").json()["state"] == "cancelled"
        third = submit(http, payload=QUICK)["id"]  # runs only once the cancelled work let go
        assert wait_state(http, third, "succeeded")["node"] == "a1"
        node = http.get("/v1/nodes/a1").json()
        assert node["allocations"] == [], node


def test_kill_9_of_an_agent_requeues_its_job_on_the_other_agent(cluster: Cluster) -> None:
    cluster.start_server(node_timeout=1.5)
    doomed = cluster.start_agent("a1")
    cluster.start_agent("a2")
    with cluster.client() as http:
        http.post("/v1/nodes/a2/pause").raise_for_status()  # so the job lands on a1
        job_id = submit(http, payload={"steps": 30, "step_s": 0.05})["id"]
        assert wait_state(http, job_id, "running")["node"] == "a1"
        http.post("/v1/nodes/a2/resume").raise_for_status()
        doomed.kill9()
        done = wait_state(http, job_id, "succeeded", timeout=20)
        assert (done["node"], done["attempt"]) == ("a2", 2), done
        kinds = [e["event"] for e in events(http, job_id)]
        assert "job.requeued" in kinds, kinds
        assert http.get("/v1/nodes/a1").json()["state"] == "lost"


def test_a_restarted_agent_reconnects_and_the_server_resyncs(cluster: Cluster) -> None:
    cluster.start_server(node_timeout=30)  # the restart, not the timeout, must settle it
    first = cluster.start_agent("a1", "--cpus", "1")
    with cluster.client() as http:
        job_id = submit(http, payload={"steps": 30, "step_s": 0.05})["id"]
        wait_state(http, job_id, "running")
        first.kill9()
        cluster.start_agent("a1", "--cpus", "1")  # same node, remembers nothing
        done = wait_state(http, job_id, "succeeded", timeout=20)
        assert done["attempt"] == 2, done  # the hello told the server attempt 1 was lost
        requeued = [e for e in events(http, job_id) if e["event"] == "job.requeued"]
        assert "restarted" in requeued[0]["data"]["data"]["why"], requeued


def test_a_result_made_while_the_server_was_down_is_delivered_after_it_returns(
    cluster: Cluster,
) -> None:
    server = cluster.start_server(node_timeout=30)
    agent = cluster.start_agent("a1", "--cpus", "1")
    with cluster.client() as http:
        job_id = submit(http, payload={"steps": 20, "step_s": 0.05})["id"]
        wait_state(http, job_id, "running")
    server.kill9()
    mark = len(agent.lines)
    agent.wait_for(r"link to .* dialling again", after=mark)  # the agent noticed
    cluster.start_server(node_timeout=30)  # same ports, same database
    agent.wait_for(r"connected to grpc://", after=mark)
    with cluster.client() as http:
        done = wait_state(http, job_id, "succeeded", timeout=20)
        assert done["attempt"] == 1, done  # the held result was resent, not the work redone
        assert done["result"][0]["name"] == "image.png"


def test_a_second_agent_cannot_take_a_live_nodes_name(cluster: Cluster) -> None:
    """Two machines with one hostname (or a stolen join token): the second agent is told the
    name is taken and keeps trying; the first keeps its name and its work."""
    cluster.start_server()
    cluster.start_agent("a1", "--cpus", "1")
    other = cluster.tmp / "another-machine"
    clone = cluster.start_agent("a1", "--cpus", "1", "--work-dir", str(other), wait=False)
    clone.wait_for(r"held by another agent that is still connected")
    assert (other / "node-key").read_text() != (cluster.tmp / "a1" / "node-key").read_text()
    with cluster.client() as http:
        done = wait_state(http, submit(http, payload=QUICK)["id"], "succeeded")
        assert done["node"] == "a1"
        assert [n["name"] for n in http.get("/v1/nodes").json()] == ["a1"]


def test_a_batch_cut_short_keeps_what_finished_and_reruns_only_what_never_ran(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    with cluster.client() as http:
        sample = {"kind": "sample", "batch_key": "sd15"}
        quick = {"steps": 2, "step_s": 0.05, "preview_every": 0}
        ids = [
            submit(http, **sample, payload={**quick, "prompt": "ok"}),
            submit(http, **sample, payload={**quick, "size": 1}),  # refused by the executor
            submit(http, **sample, payload={**quick, "prompt": "later"}),
        ]
        cluster.start_agent("a1", "--cpus", "1")  # all three queued: one batch
        first, bad, later = (j["id"] for j in ids)
        done = wait_state(http, first, "succeeded")
        [result] = done["result"]
        assert http.get(result["url"]).content.startswith(b"\x89PNG")
        failed = wait_state(http, bad, "failed")
        assert failed["attempt"] == 1
        assert "size" in failed["error"]
        rerun = wait_state(http, later, "succeeded")
        assert rerun["attempt"] == 2, "it ran once, after the batch was cut short"
        assert rerun["failures"] == 0
        kinds = [e["event"] for e in events(http, later)]
        assert kinds.count("job.requeued") == 1
        assert done["attempt"] == 1, "what finished was not run again"


def test_cancelling_one_job_of_a_running_batch_skips_it_and_the_rest_run(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    with cluster.client() as http:
        sample = {"kind": "sample", "batch_key": "sd15"}
        slow = {"steps": 20, "step_s": 0.1, "preview_every": 0}
        first, dropped, last = (
            submit(http, **sample, payload={**slow, "prompt": p})["id"] for p in "abc"
        )
        cluster.start_agent("a1", "--cpus", "1")  # all three queued: one batch
        eventually(lambda: job(http, first)["progress"] > 0, what="the first job runs")
        assert http.post(f"/v1/jobs/{dropped}/cancel").json()["state"] == "cancelled"
        assert wait_state(http, last, "succeeded")["attempt"] == 1
        assert wait_state(http, first, "succeeded")["attempt"] == 1
        assert [e["event"] for e in events(http, dropped)][-1] == "job.cancelled"
    assert f"job {dropped} was cancelled; skipping it, the batch goes on" in cluster.logs()


def test_interrupting_one_job_of_a_running_batch_keeps_its_picture_so_far(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    with cluster.client() as http:
        sample = {"kind": "sample", "batch_key": "sd15"}
        slow = {"steps": 400, "step_s": 0.05, "preview_every": 0}  # 20 s unless stopped
        quick = {"steps": 2, "step_s": 0.05, "preview_every": 0}
        first = submit(http, **sample, payload={**slow, "prompt": "a"})["id"]
        last = submit(http, **sample, payload={**quick, "prompt": "b"})["id"]
        cluster.start_agent("a1", "--cpus", "1")  # both queued: one batch
        eventually(lambda: job(http, first)["progress"] > 0.01, what="the first job runs")
        assert http.post(f"/v1/jobs/{first}/interrupt").status_code == 200
        stopped = wait_state(http, first, "succeeded", "cancelled")
        assert stopped["state"] == "succeeded", stopped  # what was made is kept
        assert [f["name"] for f in stopped["result"]] == ["image.png"]
        assert wait_state(http, last, "succeeded")["attempt"] == 1, "the batch went on"
    assert f"job {first} was interrupted; stopping it, the batch goes on" in cluster.logs()
