"""The baselines' choices, invariants of every policy under the simulator, determinism.

The world refuses any plan that over-commits a GPU or splits a gang
(``PlanRejected``), so simply running random scenarios to the end checks
those invariants for each policy; the properties add what the report shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simtest import SimRun

from corral.core import Allocation, Job, ResourceRequest, Team
from corral.scheduler.api import Config, Snapshot
from corral.sim import generate
from corral.sim.baselines import best_fit, first_fit
from corral.sim.policies import resolve
from corral.sim.runner import ScheduleFn, simulate
from corral.sim.scenario import Scenario, SimJob, fixed_jobs
from corral.sim.traces import write_trace

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(busy: dict[str, int], job: Job) -> Snapshot:
    """Three 4-GPU nodes, ``busy[node]`` GPUs taken on each, ``job`` queued."""
    nodes = generate.cluster(3, 4)
    allocs = tuple(
        Allocation(f"x{n}", (f"x{n}",), n, gpu_indices=tuple(range(k)), gpu_milli=1000)
        for n, k in busy.items()
    )
    return Snapshot(nodes=nodes, queued=(job,), allocations=allocs)


@pytest.mark.parametrize(
    ("policy", "want_node"),
    [
        pytest.param(first_fit, "node-1", id="first-fit-takes-the-first-node-with-room"),
        pytest.param(best_fit, "node-3", id="best-fit-takes-the-tightest-node"),
    ],
)
def test_baselines_choose_their_node(policy: ScheduleFn, want_node: str) -> None:
    # node-1 has 3 free, node-2 4 free, node-3 2 free; a 2-GPU job fits all three.
    snap = _snapshot({"node-1": 1, "node-3": 2}, Job("j", resources=ResourceRequest(gpus=2)))
    [placement] = policy(snap, Config(), 0.0, 0).placements
    assert placement.node == want_node
    assert len(placement.gpu_indices) == 2


def test_a_gang_that_does_not_fit_takes_nothing_and_later_jobs_still_place() -> None:
    gang = Job("gang", resources=ResourceRequest(gpus=4), replicas=3, submitted_at=0)
    small = Job("small", resources=ResourceRequest(gpus=1), submitted_at=1)
    snap = Snapshot(nodes=generate.cluster(2, 4), queued=(gang, small))
    plan = first_fit(snap, Config(), 0.0, 0)
    assert [p.job_ids for p in plan.placements] == [("small",)]
    assert [u.job_id for u in plan.unplaced] == ["gang"]
    assert plan.placements[0].node == "node-1"  # the gang's tentative picks were undone


def test_shared_gpu_jobs_fill_a_card_before_taking_a_fresh_one() -> None:
    share = ResourceRequest(gpu_milli=500)
    jobs = tuple(Job(f"s{i}", resources=share, submitted_at=i) for i in range(3))
    plan = first_fit(Snapshot(nodes=generate.cluster(1, 2), queued=jobs), Config(), 0.0, 0)
    assert [(p.gpu_indices, p.gpu_milli) for p in plan.placements] == [
        ((0,), 500),
        ((0,), 500),
        ((1,), 500),
    ]


JOB_SHAPES = st.sampled_from([0.25, 0.5, 1, 1, 2, 4, 0])


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """2-4 nodes of 4 GPUs, two quota teams, 1-25 jobs that each fit on some node."""
    nodes = generate.cluster(draw(st.integers(2, 4)), 4)
    teams = (Team("a", quota_gpus=4, borrow_limit_gpus=4), Team("b", quota_gpus=4))
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        gpus = draw(JOB_SHAPES)
        replicas = draw(st.integers(1, 2)) if gpus >= 1 else 1
        request = ResourceRequest.from_gpus(gpus, cpus=1)
        job = Job(
            f"j{i}",
            resources=request,
            team=draw(st.sampled_from(["a", "b"])),
            user=draw(st.sampled_from(["u1", "u2", "u3"])),
            priority=draw(st.sampled_from(["paid", "free", "batch"])),
            replicas=replicas,
            submitted_at=float(draw(st.integers(0, 50))),
        )
        jobs.append(SimJob(job, float(draw(st.integers(1, 100)))))
    jobs.sort(key=lambda j: j.submit_at)
    return Scenario(nodes=nodes, jobs=fixed_jobs(tuple(jobs)), teams=teams, auto_teams=False)


@pytest.mark.parametrize("policy", ["corral", "first-fit", "best-fit"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_every_policy_finishes_every_job_without_breaking_invariants(
    policy: str, scenario: Scenario
) -> None:
    # PlanRejected (a GPU over-committed, a gang split, a job placed twice) fails the test.
    summary = simulate(scenario, resolve(policy))
    total = len(list(scenario.jobs()))
    assert summary["jobs_total"] == total
    assert summary["jobs_completed"] == total  # every job fits somewhere, so all end
    wants_gpus = any(j.job.resources.wants_gpu for j in scenario.jobs())
    assert 0 <= summary["gpu_allocation_ratio"] <= 1
    assert (summary["gpu_allocation_ratio"] > 0) == wants_gpus
    if policy == "corral":
        assert summary["quota_violations"] == 0  # a never exceeds quota 4 + borrow 4


def test_a_policy_blind_to_quotas_is_counted_each_time_it_passes_a_teams_limit() -> None:
    # a may hold 1 GPU (quota 1, no borrowing), b has no limit. First-fit ignores quotas:
    # a's second and third jobs at once pass its limit (two violations); b's never do; a
    # job of a's that starts after the others ended is within it again.
    nodes = generate.cluster(1, 4)
    teams = (Team("a", quota_gpus=1, borrow_limit_gpus=0), Team("b", quota_gpus=0))
    one = ResourceRequest(gpus=1)
    jobs = [SimJob(Job(f"a{i}", resources=one, team="a"), 10.0) for i in range(3)]
    jobs.append(SimJob(Job("b0", resources=one, team="b"), 10.0))
    jobs.append(SimJob(Job("a3", resources=one, team="a", submitted_at=50.0), 10.0))
    scenario = Scenario(nodes=nodes, jobs=fixed_jobs(tuple(jobs)), teams=teams)
    assert simulate(scenario, first_fit)["quota_violations"] == 2
    assert simulate(scenario, "corral")["quota_violations"] == 0


def test_the_same_seed_gives_the_same_report_and_another_trace_seed_another(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path], tmp_path: Path
) -> None:
    cluster = write("cluster.yaml", "nodes: [{name: n, count: 3, gpus: 8}]\n")

    def trace(seed: int) -> Path:
        path = tmp_path / f"t{seed}.jsonl"
        write_trace(generate.trace(generate.TraceShape(jobs=150, total_gpus=24, seed=seed)), path)
        return path

    first = run_sim(trace(1), "--cluster", str(cluster), "--seed", "5").report
    again = run_sim(trace(1), "--cluster", str(cluster), "--seed", "5").report
    other = run_sim(trace(2), "--cluster", str(cluster), "--seed", "5").report
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert first["summary"] != other["summary"]


def test_the_bench_runs_small_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sim.py"), "--nodes", "6", "--jobs", "300"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "simulated jobs/s (6 nodes, 300 jobs" in out
    assert "[pure]     simulated jobs/s (6 nodes, 300 jobs, corral): " in out
    if "[compiled] " in out:  # scripts/build-native built the current sources
        assert "compiled and pure Python runs give the same results: yes" in out
    for policy in ("corral", "first-fit", "best-fit"):
        assert f"gpu_allocation_ratio ({policy}): " in out
        assert f"  p95 wait s by size ({policy}): 0.5: " in out
        assert f"  p95 wait s incl. queued by size ({policy}): 0.5: " in out
    assert "gpu_allocation_ratio corral / first-fit / best-fit: " in out
    assert "(started jobs only / counting jobs still queued at the end)" in out


def test_the_kept_scheduler_and_the_one_rebuilt_every_cycle_simulate_the_same_run() -> None:
    # Preemption (teams borrow and reclaim), gangs, shares, reservations and backfill
    # (the trace carries estimates): the same report either way, cycle for cycle.
    kept = simulate(generate.scenario(8, 600, load=1.2, seed=4, cycle_interval_s=30), "corral")
    rebuilt = simulate(
        generate.scenario(8, 600, load=1.2, seed=4, cycle_interval_s=30), "corral-rebuild"
    )
    assert kept == rebuilt
    assert kept["preemptions"] > 0
    assert kept["cycles"] > 100
