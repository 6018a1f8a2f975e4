"""The ready ``corral sim`` scenarios in ``examples/`` run as their comments say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli.main import app

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(name: str) -> dict[str, Any]:
    done = CliRunner().invoke(app, ["sim", str(EXAMPLES / name), "--json", "--no-jobs"])
    assert done.exit_code == 0, done.output
    summary: dict[str, Any] = json.loads(done.stdout)["summary"]
    assert summary["jobs_completed"] == summary["jobs_total"]
    return summary


def test_every_example_runs() -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert names, "no examples"
    for name in names:
        run(name)


def test_home_gpu_serves_the_late_users_between_the_flood_s_jobs() -> None:
    waits = run("home-gpu.yaml")["wait_by_user"]
    assert waits["alice"]["p95_s"] <= 20  # at most one picture
    assert waits["bob"]["p95_s"] <= 20
    assert waits["spammer"]["p50_s"] > 100


@pytest.mark.parametrize(("name", "preempted"), [("two-teams.yaml", 2), ("gang-training.yaml", 0)])
def test_quota_is_taken_back_by_preemption_and_the_gang_starts_at_once(
    name: str, preempted: int
) -> None:
    summary = run(name)
    assert summary["preemptions"] == preempted
    assert summary["quota_violations"] == 0
    if name == "gang-training.yaml":
        assert summary["wait_p95_s"] == 0  # the gang too: two whole nodes were kept free
