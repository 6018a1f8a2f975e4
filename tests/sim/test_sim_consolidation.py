"""The simulator applies consolidation moves as the server does (a stop and a requeue) and
counts them apart from preemptions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from corral.sim.loaders import load_scenario
from corral.sim.runner import simulate

SCENARIO = Path(__file__).resolve().parent / "parity" / "consolidation.yaml"


def test_a_move_lets_the_waiting_job_run_and_is_counted_as_a_move() -> None:
    summary = simulate(load_scenario(SCENARIO), "corral")
    assert summary["consolidation_moves"] == 1
    assert summary["preemptions"] == 0
    assert summary["jobs_queued"] == 0  # the 4-GPU job runs, and so does the moved one
    assert summary["wait_p95_s"] == 0.0


def test_without_moves_the_job_waits_and_the_summary_says_nothing_of_them() -> None:
    scenario = load_scenario(SCENARIO)
    still = replace(scenario, config=replace(scenario.config, consolidation_moves=0))
    summary = simulate(still, "corral")
    assert "consolidation_moves" not in summary
    assert summary["jobs_queued"] == 1
