"""Checkpoint and resume across machines, with real processes.

A training job checkpoints on one agent (a Python handler writing files into
its checkpoint directory); the agent is killed with ``kill -9``; the job is
requeued onto another agent with its own disk, which downloads the uploaded
checkpoint and resumes at its step. The API says "resumed from step N".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from e2e_harness import Cluster, eventually, job, submit, wait_state

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench"
HANDLER = ("--handler", "chaos_work:run", "--fake-gpus", "1x RTX 4090 24GiB")


def ledger(path: Path) -> list[tuple[str, int, int]]:
    if not path.exists():
        return []
    rows = (line.split() for line in path.read_text().splitlines())
    return [(key, int(attempt), int(step)) for key, attempt, step in rows]


def test_a_job_killed_with_its_machine_resumes_from_its_uploaded_checkpoint(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("CHAOS_LEDGER", str(tmp_path / "ledger"))
    cluster.start_server(node_timeout=2.0)
    first = cluster.start_agent("box-a", *HANDLER)
    with cluster.client() as c:
        payload = {"key": "k1", "steps": 40, "step_s": 0.1, "checkpoint_every": 5}
        j = submit(c, kind="train", payload=payload, resources={"gpus": 1}, max_attempts=5)
        saved = eventually(
            lambda: (job(c, j["id"]).get("checkpoint_step") or 0) >= 10 and job(c, j["id"]),
            20,
            "a checkpoint at step 10 or later",
        )
        assert saved["checkpoint"].startswith("blob:uploads/"), "uploaded, not a local path"
        first.kill9()
        cluster.start_agent("box-b", *HANDLER)

        done = wait_state(c, j["id"], "succeeded", timeout=40)
        step = done["resumed_from_step"]
        assert done["attempt"] == 2
        assert step >= saved["checkpoint_step"]
        assert [a["node"] for a in done["attempts"]] == ["box-a"]
        result = c.get(f"/v1/jobs/{j['id']}/result/result.json").json()
        assert result == {"key": "k1", "attempt": 2, "resumed_from": step, "steps": 40}

    second = [s for key, attempt, s in ledger(tmp_path / "ledger") if attempt == 2]
    assert second == list(range(step + 1, 41)), "the second machine ran only what was left"


def test_a_checkpoint_on_shared_storage_is_reported_by_path(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])
    )
    cluster.start_server(node_timeout=2.0)
    shared = tmp_path / "box-a"  # the agent's work dir: its checkpoints live under it
    cluster.start_agent("box-a", *HANDLER, "--shared-storage", str(shared))
    with cluster.client() as c:
        payload = {"key": "k2", "steps": 6, "step_s": 0.05, "checkpoint_every": 2}
        j = submit(c, kind="train", payload=payload, resources={"gpus": 1})
        done = wait_state(c, j["id"], "succeeded", timeout=30)
    path = Path(done["checkpoint"])
    assert path.is_relative_to(shared)
    assert json.loads(path.read_text()) == {"key": "k2", "step": 4}
    assert done["checkpoint_step"] == 4
