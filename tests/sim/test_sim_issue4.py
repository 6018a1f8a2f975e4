"""Issue 4's situations, gangs and preemption, replayed through corral's scheduler.

Each scenario file is the situation as the issue words it (4 nodes x 10 GPUs,
two teams with a quota of 20 GPUs each) and the assertions are its wanted
outcome, read off the ``corral sim --json`` report.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from simtest import SCENARIOS, SimRun


def _gpus(run: SimRun, prefix: str) -> float:
    """GPUs held at the end by the jobs whose id starts with ``prefix``."""
    return sum(p["gpus"] for j in run.running(prefix) for p in j["placements"] if p["end"] is None)


def test_greedy_team_asking_at_once_gets_only_its_quota_and_b_gets_20(
    run_sim: Callable[..., SimRun],
) -> None:
    run = run_sim(SCENARIOS / "greedy_team_at_once.yaml")
    assert _gpus(run, "b") == 20
    assert all(run.job(f"b{i}")["wait_s"] == 0 for i in range(1, 11))
    assert _gpus(run, "a") <= 20  # its excess is never granted
    assert run.summary["preemptions"] == 0
    assert run.summary["quota_violations"] == 0


def test_greedy_team_borrowing_while_b_is_idle_gives_back_exactly_its_excess(
    run_sim: Callable[..., SimRun],
) -> None:
    run = run_sim(SCENARIOS / "greedy_team_reclaimed.yaml")
    assert _gpus(run, "b") == 20
    assert all(run.job(f"b{i}")["wait_s"] == 0 for i in range(1, 21))
    assert _gpus(run, "a") == 20
    assert run.summary["preemptions"] == 10  # a's 10 borrowed GPUs, no more
    preempted = [j for j in run.report["jobs"] if j["id"].startswith("a") and j["attempts"] == 1]
    assert len(preempted) == 30
    assert sum(1 for j in preempted if j["state"] == "queued") == 10


def test_fragmentation_an_8_gpu_job_runs_at_once_next_to_six_3_gpu_jobs(
    run_sim: Callable[..., SimRun],
) -> None:
    run = run_sim(SCENARIOS / "fragmentation.yaml")
    big = run.job("b1")
    assert big["wait_s"] == 0
    assert big["placements"][0]["gpus"] == 8
    assert run.summary["preemptions"] == 0
    assert len(run.running("a")) == 6


def test_idle_quota_reclaims_only_as_many_borrowed_gpus_as_b_needs(
    run_sim: Callable[..., SimRun],
) -> None:
    # a holds 35 of 40 GPUs (15 borrowed); b asks for 10: 5 are free, 5 are reclaimed.
    run = run_sim(SCENARIOS / "idle_quota.json")
    assert all(run.job(f"b{i}")["wait_s"] == 0 for i in range(1, 11))
    assert _gpus(run, "b") == 10
    assert run.summary["preemptions"] == 5
    assert _gpus(run, "a") == 30
    victims = [j for j in run.report["jobs"] if any(p["preempted"] for p in j["placements"])]
    assert len(victims) == 5
    assert all(p["end"] == 300 for j in victims for p in j["placements"] if p["preempted"])


def test_a_gang_waits_until_all_replicas_fit_then_starts_them_together(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    path = write(
        "gang.yaml",
        """
        nodes: [{name: n, count: 2, gpus: 8}]
        jobs:
          - {id: small, submit_at: 0, duration: 50, gpus: 4}
          - {id: gang, submit_at: 10, duration: 100, gpus: 8, replicas: 2}
        """,
    )
    run = run_sim(path)
    gang = run.job("gang")
    assert gang["state"] == "succeeded"
    assert gang["wait_s"] == 40  # not before small frees node n-1 at 50
    assert sorted(p["node"] for p in gang["placements"]) == ["n-1", "n-2"]
    assert {(p["start"], p["end"], p["gpus"]) for p in gang["placements"]} == {(50, 150, 8)}


def test_a_higher_class_preempts_a_lower_one_of_its_team_which_resumes_its_work(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    path = write(
        "priority.yaml",
        """
        nodes: [{name: n, gpus: 4}]
        jobs:
          - {id: low, submit_at: 0, duration: 1000, gpus: 4, priority: batch}
          - {id: high, submit_at: 200, duration: 100, gpus: 4, priority: paid}
        """,
    )
    run = run_sim(path)
    assert run.job("high")["wait_s"] == 0
    low = run.job("low")
    assert low["attempts"] == 2
    assert low["state"] == "succeeded"
    spans = [(p["start"], p["end"], p["preempted"]) for p in low["placements"]]
    assert spans == [(0, 200, True), (300, 1100, False)]  # 800 s of work were left
    assert run.summary["preemptions"] == 1


def test_a_non_preemptible_job_is_never_evicted_and_the_higher_one_waits(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    path = write(
        "pinned.yaml",
        """
        nodes: [{name: n, gpus: 4}]
        jobs:
          - {id: pinned, submit_at: 0, duration: 1000, gpus: 4, priority: batch,
             preemptible: false}
          - {id: high, submit_at: 200, duration: 100, gpus: 4, priority: paid}
        """,
    )
    run = run_sim(path)
    assert run.summary["preemptions"] == 0
    assert run.job("high")["wait_s"] == 800


def test_a_lower_class_never_preempts_a_higher_one(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    path = write(
        "inverse.yaml",
        """
        nodes: [{name: n, gpus: 4}]
        jobs:
          - {id: high, submit_at: 0, duration: 1000, gpus: 4, priority: paid}
          - {id: low, submit_at: 200, duration: 100, gpus: 4, priority: batch}
        """,
    )
    run = run_sim(path)
    assert run.summary["preemptions"] == 0
    assert run.job("low")["wait_s"] == 800
