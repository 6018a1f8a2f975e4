"""Autoscaling in the simulator: pools, the pure autoscaler on virtual time, and its report.

Times below are worked out by hand from the rules in docs/sim.md ("Autoscaling"):
the autoscaler decides at multiples of ``tick_s`` (and sleeps while nothing can
change), a job waits from the first decision that sees it unplaced, a launched
machine joins ``boot_s`` later, an idle machine is drained at the first decision
``idle_s`` after the one that first saw it idle and removed at the next one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from simtest import SCENARIOS, SimRun
from typer.testing import CliRunner

from corral.cli.main import app
from corral.sim.errors import SimInputError
from corral.sim.loaders import load_scenario

GOLDEN = Path(__file__).resolve().parent / "golden"
POOL = "{name: gpu, gpus: 1, gpu_model: L4, vram: 24GiB, cpus: 8, max_nodes: 3, cost_per_hour: 2.0}"


def test_a_burst_launches_machines_after_the_delay_and_removes_them_when_idle(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    # Four 600 s jobs at 0, no fixed nodes, at most 3 machines. Decisions at 0 and 15
    # see the jobs waiting less than scale_up_delay_s (30); the one at 30 launches 3
    # machines, whose nodes join at 90: three jobs run 90..690, the fourth 690..1290
    # on gpu-1. gpu-2 and gpu-3 are first seen idle at 690, drained at 990, removed
    # at 1005; gpu-1 idle at 1290, drained at 1590, removed at 1605 (the end).
    path = write(
        "burst.yaml",
        f"""
        pools: [{POOL}]
        autoscale: {{scale_up_delay_s: 30, idle_s: 300, tick_s: 15, boot_s: 60}}
        jobs:
          - {{id: a, duration: 600}}
          - {{id: b, duration: 600}}
          - {{id: c, duration: 600}}
          - {{id: d, duration: 600}}
        """,
    )
    run = run_sim(path)
    s = run.summary
    assert s["jobs_completed"] == 4
    assert [run.job(j)["wait_s"] for j in "abcd"] == [90, 90, 90, 690]
    assert run.job("d")["placements"][0]["node"] == "gpu-1"
    assert {run.job(j)["placements"][0]["node"] for j in "abc"} == {"gpu-1", "gpu-2", "gpu-3"}
    scaled = s["autoscaler"]
    assert (scaled["launched"], scaled["removed"], scaled["nodes_at_end"]) == (3, 3, 0)
    assert scaled["peak_nodes"] == 3
    node_s = (1605 - 90) + 2 * (1005 - 90)  # 3,345 node-seconds
    assert scaled["node_hours"] == {"gpu": pytest.approx(node_s / 3600, abs=1e-6)}
    assert scaled["cost"] == pytest.approx(2.0 * node_s / 3600, abs=1e-6)
    assert s["end_s"] == 1605
    assert s["gpus_total"] == 3  # the most there were at once
    # 4 x 600 GPU-seconds allocated of the 3,345 the machines were there for
    assert s["gpu_allocation_ratio"] == pytest.approx(2400 / node_s, abs=1e-6)


def test_the_allocation_ratio_counts_the_gpus_that_existed_over_time(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    # One fixed 1-GPU node and a pool of one. a runs on n at 0..600; b waits, a machine
    # is launched at 30 (scale_up_delay_s 30), joins at 90, runs b 90..690; first seen
    # idle at 690, drained at 990, removed at 1005, the end of the run. GPU-seconds
    # that existed: n 1 x 1005, the machine 1 x (1005 - 90) = 915.
    path = write(
        "mixed.yaml",
        f"""
        nodes: [{{name: n, gpus: 1}}]
        pools: [{POOL.replace("max_nodes: 3", "max_nodes: 1")}]
        autoscale: {{scale_up_delay_s: 30, idle_s: 300, tick_s: 15, boot_s: 60}}
        jobs: [{{id: a, duration: 600}}, {{id: b, duration: 600}}]
        """,
    )
    s = run_sim(path).summary
    assert s["end_s"] == 1005
    assert s["gpu_allocation_ratio"] == pytest.approx(1200 / (1005 + 915), abs=1e-6)
    assert s["gpus_total"] == 2
    assert s["autoscaler"]["node_hours"]["gpu"] == pytest.approx(915 / 3600, abs=1e-6)


def test_max_nodes_holds_under_a_large_burst(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    jobs = "\n".join(f"  - {{id: j{i}, submit_at: {i % 7}, duration: 120}}" for i in range(60))
    path = write(
        "big.yaml",
        f"pools: [{POOL.replace('max_nodes: 3', 'max_nodes: 4')}]\n"
        "autoscale: {scale_up_delay_s: 0, max_launch: 10}\njobs:\n" + jobs + "\n",
    )
    run = run_sim(path)
    s = run.summary
    assert s["jobs_completed"] == 60
    assert s["autoscaler"]["peak_nodes"] == 4
    assert s["autoscaler"]["launched"] == 4  # busy until the queue drained: none relaunched
    assert s["autoscaler"]["removed"] == 4
    nodes = {p["node"] for j in run.report["jobs"] for p in j["placements"]}
    assert nodes == {"gpu-1", "gpu-2", "gpu-3", "gpu-4"}
    assert s["gpus_total"] == 4


def test_demand_that_comes_back_undrains_a_machine_instead_of_launching_one(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    # a runs on gpu-1 60..160 (launched at 0, scale_up_delay_s 0). First seen idle at
    # 165, drained at 225. b comes at 230 and finds it draining; the decision at 240
    # undrains it rather than removing it, and b runs there at once.
    path = write(
        "back.yaml",
        f"""
        pools: [{POOL}]
        autoscale: {{scale_up_delay_s: 0, idle_s: 60, tick_s: 15, boot_s: 60}}
        jobs: [{{id: a, duration: 100}}, {{id: b, submit_at: 230, duration: 100}}]
        """,
    )
    run = run_sim(path)
    assert run.job("a")["placements"][0]["start"] == 60
    assert run.job("b")["placements"] == [
        {"node": "gpu-1", "gpus": 1.0, "start": 240.0, "end": 340.0, "preempted": False}
    ]
    scaled = run.summary["autoscaler"]
    assert (scaled["launched"], scaled["removed"]) == (1, 1)


def test_min_nodes_are_started_before_any_work_and_kept(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    # The decision at 0 tops the pool up to min_nodes: the machine joins at 60 and runs
    # the job that came at 0 without waiting for scale_up_delay_s (600).
    path = write(
        "floor.yaml",
        f"""
        pools: [{POOL.replace("max_nodes: 3", "min_nodes: 1, max_nodes: 3")}]
        autoscale: {{scale_up_delay_s: 600, idle_s: 60}}
        jobs: [{{id: a, duration: 100}}]
        """,
    )
    run = run_sim(path)
    assert run.job("a")["wait_s"] == 60
    scaled = run.summary["autoscaler"]
    assert (scaled["launched"], scaled["removed"], scaled["nodes_at_end"]) == (1, 0, 1)


def test_work_no_pool_fits_stays_queued_and_the_run_still_ends(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    path = write("nofit.yaml", f"pools: [{POOL}]\njobs: [{{id: big, gpus: 8, duration: 60}}]\n")
    run = run_sim(path)
    assert run.job("big")["state"] == "queued"
    assert run.summary["autoscaler"]["launched"] == 0


def test_the_same_seed_gives_the_same_report() -> None:
    runner = CliRunner()
    args = ["sim", str(SCENARIOS / "autoscale_burst.yaml"), "--json", "--seed", "7"]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0, first.stderr
    assert first.stdout == second.stdout
    assert json.loads(first.stdout)["seed"] == 7


BAD = [
    ("unknown-autoscale-key", "autoscale: {idle: 60}", "autoscale.idle"),
    ("negative-idle", "autoscale: {idle_s: -1}", "autoscale.idle_s"),
    ("negative-max-launch", "autoscale: {max_launch: -1}", "autoscale.max_launch"),
    ("zero-tick", "autoscale: {tick_s: 0}", "autoscale.tick_s"),
    ("boot-never-joins", "autoscale: {boot_s: 900}", "autoscale.boot_s"),
    ("unknown-pool-key", "pools: [{name: g, max_node: 3}]", "pools[0].max_node"),
    ("pool-without-vram", "pools: [{name: g, gpus: 1}]", "pools[g].vram"),
    ("bad-pool-vram", "pools: [{name: g, gpus: 1, vram: lots}]", "pools[0].vram"),
    ("empty-pools", "pools: []", "pools"),
]


@pytest.mark.parametrize(
    ("text", "want_field"), [pytest.param(t, f, id=name) for name, t, f in BAD]
)
def test_bad_pools_and_autoscale_settings_name_the_field(
    write: Callable[[str, str], Path], text: str, want_field: str
) -> None:
    pools = "" if text.startswith("pools") else "pools: [{name: g, gpus: 1, vram: 24GiB}]\n"
    path = write("bad.yaml", pools + text + "\n")
    with pytest.raises(SimInputError) as info:
        load_scenario(path)
    assert info.value.field == want_field
    assert want_field in str(info.value)


def test_autoscale_needs_pools_and_a_scenario_needs_nodes_or_pools(
    write: Callable[[str, str], Path],
) -> None:
    with pytest.raises(SimInputError, match="needs pools") as info:
        load_scenario(write("nopools.yaml", "nodes: [{}]\nautoscale: {idle_s: 60}\n"))
    assert info.value.field == "autoscale"
    with pytest.raises(SimInputError, match="at least one node"):
        load_scenario(write("empty.yaml", "jobs: []\n"))
    scenario = load_scenario(write("pools.yaml", "pools: [{name: g, gpus: 1, vram: 24GiB}]\n"))
    assert scenario.nodes == ()
    assert scenario.autoscaling.tick_s == 15
    assert scenario.autoscaling.boot_s == 60


GOLDEN_RUNS = [
    ("fragmentation.json", ["fragmentation.yaml"]),
    ("greedy_team_reclaimed.json", ["greedy_team_reclaimed.yaml"]),
    ("idle_quota.json", ["idle_quota.json"]),
    ("first_fit_waits.json", ["first_fit_waits.yaml"]),
    ("greedy_team_at_once.best-fit.json", ["greedy_team_at_once.yaml", "--policy", "best-fit"]),
    ("idle_quota.until500.seed3.json", ["idle_quota.json", "--until", "500", "--seed", "3"]),
]


@pytest.mark.parametrize(("golden", "args"), GOLDEN_RUNS, ids=[g for g, _ in GOLDEN_RUNS])
def test_a_scenario_without_pools_reports_byte_for_byte_what_it_did_before_autoscaling(
    golden: str, args: list[str]
) -> None:
    # The golden files are ``corral sim --json`` output saved before the simulator
    # learned to autoscale (and again when it learned to wake for time passing, which
    # added a cycle, and so a fragmentation sample, where a minimum run time ran out).
    result = CliRunner().invoke(app, ["sim", str(SCENARIOS / args[0]), "--json", *args[1:]])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (GOLDEN / golden).read_text(encoding="utf-8")
    assert "autoscaler" not in json.loads(result.stdout)["summary"]


def test_the_example_scenario_runs_from_the_command_line(run_sim: Callable[..., SimRun]) -> None:
    # 8 small jobs, at most 4 L4 machines: the other 4 go to an A100 machine (the
    # cheapest pool with room), which the 8-GPU jobs at 600 then find idle.
    run = run_sim(SCENARIOS / "autoscale_burst.yaml")
    s = run.summary
    assert s["jobs_completed"] == s["jobs_total"] == 10
    scaled = s["autoscaler"]
    assert scaled["launched"] == scaled["removed"] == 6
    assert scaled["peak_nodes"] == 6
    assert set(scaled["node_hours"]) == {"l4", "a100"}
    cost = 0.8 * scaled["node_hours"]["l4"] + 32.0 * scaled["node_hours"]["a100"]
    assert scaled["cost"] == pytest.approx(cost, abs=1e-4)  # hours are rounded to 1e-6
    assert run.job("t1")["placements"][0]["node"] == "a100-1"
    table = CliRunner().invoke(app, ["sim", str(SCENARIOS / "autoscale_burst.yaml")])
    assert table.exit_code == 0, table.stderr
    assert "autoscaler: 6 launched, 6 removed" in " ".join(table.stdout.split())
    assert "node-hours" in table.stdout


def test_the_command_line_prints_the_field_of_a_bad_pool(
    write: Callable[[str, str], Path],
) -> None:
    path = write("bad.yaml", "pools:\n  - name: g\n    gpus: 1\n")
    result = CliRunner().invoke(app, ["sim", str(path)])
    assert result.exit_code == 2
    assert "line 2: pools[g].vram: a pool with GPUs must say their VRAM" in result.stderr


def test_work_a_later_scheduling_tick_leaves_waiting_wakes_the_autoscaler(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    # Cycles only every 60 s: the decision at 15 sees nothing waiting yet (no cycle has
    # run) and sleeps; the cycle at 60 leaves the job unplaced, which wakes it: launched
    # at 60, joined at 120, and the cycle at 120 places the job (wait 115).
    path = write(
        "ticks.yaml",
        f"""
        cycle_interval_s: 60
        pools: [{POOL}]
        autoscale: {{scale_up_delay_s: 0, idle_s: 60, boot_s: 60}}
        jobs: [{{id: a, submit_at: 5, duration: 100}}]
        """,
    )
    run = run_sim(path)
    assert run.job("a")["wait_s"] == 115
    assert run.summary["autoscaler"]["launched"] == 1


def test_a_run_with_pools_ends_no_earlier_than_its_last_placement(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    # The job (no duration: it runs until the end) fits the fixed node; the cycle at 60
    # places it there, with nothing else happening at 60. The autoscaler has nothing to
    # do, and the run ends at that last change.
    path = write(
        "endless.yaml",
        f"""
        cycle_interval_s: 60
        nodes: [{{name: n, gpus: 1}}]
        pools: [{POOL}]
        jobs: [{{id: a, submit_at: 5}}]
        """,
    )
    run = run_sim(path)
    s = run.summary
    assert run.job("a")["state"] == "running"
    assert run.job("a")["placements"][0]["start"] == 60
    assert s["end_s"] == 60
    assert s["gpu_seconds_by_team"] == {"default": 0.0}
    assert s["autoscaler"]["launched"] == 0
