"""SDK and CLI against real processes end to end: ``corral server`` + ``corral agent``.

The agent has no GPU here, so it offers CPU slots and runs jobs with its demo
executor (progress every step, a PNG preview every few steps, a PNG result).
The process harness is the end-to-end tests' own (``tests/e2e/e2e_harness.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from e2e_harness import ADMIN, Cluster
from typer.testing import CliRunner

from corral.cli.main import app
from corral.core.states import JobState
from corral.sdk import Client

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        c.start_server()
        c.start_agent("cpu-box", "--cpus", "2")
        yield c
    finally:
        c.stop()
        print(c.logs())


def test_a_real_agent_runs_what_the_sdk_submits_and_the_cli_watches(
    cluster: Cluster, tmp_path: Path
) -> None:
    with Client(cluster.http, ADMIN) as corral:
        [node] = corral.nodes()
        assert node.name == "cpu-box"
        job = corral.submit(
            kind="sample",
            payload={"prompt": "a red barn", "steps": 6, "step_s": 0.02, "preview_every": 2},
        )
        events = list(job.events())
        progress = [e.progress for e in events if e.progress is not None]
        assert progress == sorted(progress)
        assert progress[-1] == 1.0
        previews = [e for e in events if e.preview_url]
        assert previews
        assert job.preview(previews[-1]).startswith(PNG)
        assert events[-1].kind == "job.succeeded"
        assert job.wait(timeout=10).state is JobState.SUCCEEDED
        assert job.result().read().startswith(PNG)

        second = corral.submit(kind="sample", payload={"prompt": "a horse", "steps": 4})
    env = {"CORRAL_URL": cluster.http, "CORRAL_TOKEN": ADMIN}
    env["CORRAL_CONFIG"] = str(tmp_path / "config.toml")
    watched = CliRunner().invoke(app, ["watch", second.id, "--out", str(tmp_path)], env=env)
    assert watched.exit_code == 0, watched.output
    [image] = [p for p in (tmp_path / second.id).iterdir() if p.is_file()]
    assert image.read_bytes().startswith(PNG)


def test_an_interrupted_job_reads_interrupted_in_the_sdk_and_the_cli_with_what_ran(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = {"CORRAL_URL": cluster.http, "CORRAL_TOKEN": ADMIN}
    env["CORRAL_CONFIG"] = str(tmp_path / "config.toml")
    with Client(cluster.http, ADMIN) as corral:
        job = corral.submit(kind="sample", payload={"prompt": "a slow fox", "steps": 400})
        for event in job.events(kinds=["job.progress"]):
            if event.progress:
                break  # it runs: interrupt it from the CLI
        stopped = CliRunner().invoke(app, ["interrupt", job.id], env=env)
        assert stopped.exit_code == 0, stopped.output
        final = list(job.events())[-1]
        assert (final.kind, final.interrupted) == ("job.succeeded", True)
        status = job.wait(timeout=30)
        assert (status.state, status.interrupted, status.outcome) == (
            JobState.SUCCEEDED,
            True,
            "interrupted",
        )
        assert job.result().read().startswith(PNG)  # the picture so far
        assert status.ran == {"model": "demo-tiny", "seed": status.ran["seed"]}  # it drew one
        assert "interrupted" in repr(job)
    shown = CliRunner().invoke(app, ["job", job.id], env=env)
    assert "interrupted (succeeded)" in shown.output
    assert "model=demo-tiny" in shown.output
    listed = CliRunner().invoke(app, ["jobs"], env=env)
    assert "interrupted" in next(row for row in listed.output.splitlines() if job.id in row)
    logged = CliRunner().invoke(app, ["logs", job.id, "--events"], env=env)
    last = logged.output.strip().splitlines()[-1]
    assert "job.succeeded" in last
    assert "interrupted" in last
    assert f"ran model=demo-tiny, seed={status.ran['seed']}" in last  # keys in order
