"""Reading scenarios: the issue's format, its defaults, and errors that say where."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from corral.core import DEFAULT_TEAM, GIB, MILLI
from corral.scheduler.api import Config
from corral.sim.errors import SimInputError
from corral.sim.loaders import load_scenario

ISSUE_EXAMPLE = """
nodes:      # count replicates a node; names get a -1, -2 ... suffix when count > 1
  - {name: n, count: 4, gpus: 10, gpu_model: A100, vram_gib: 80, cpus: 64, labels: {rack: r1}}
teams:
  - {name: a, quota_gpus: 20, borrow_limit_gpus: 20, weight: 1}
jobs:       # gpus may be 0 (CPU only) or a fraction < 1 (a share of one GPU); replicas > 1 is a gang
  - {id: a1, submit_at: 0, duration: 3600, gpus: 3, cpus: 8, gpu_models: [A100, H100], team: a, user: alice, priority: batch, preemptible: true, replicas: 1}
"""  # noqa: E501


def test_the_issue_example_loads_as_written(write: Callable[[str, str], Path]) -> None:
    scenario = load_scenario(write("issue.yaml", ISSUE_EXAMPLE))
    assert [n.name for n in scenario.nodes] == ["n-1", "n-2", "n-3", "n-4"]
    node = scenario.nodes[0]
    assert (len(node.gpus), node.gpus[0].model, node.gpus[0].vram_bytes) == (10, "A100", 80 * GIB)
    assert (node.cpus, dict(node.labels)) == (64, {"rack": "r1"})
    assert scenario.teams[0].quota_gpus == 20
    assert scenario.teams[0].borrow_limit_gpus == 20
    [sim_job] = list(scenario.jobs())
    job = sim_job.job
    assert (job.id, job.team, job.user, job.priority, job.replicas) == (
        "a1",
        "a",
        "alice",
        "batch",
        1,
    )
    assert job.resources.gpus == 3
    assert job.resources.cpus == 8
    assert job.resources.gpu_models == {"A100", "H100"}
    assert sim_job.duration == 3600


def test_the_same_scenario_as_json_loads_the_same(write: Callable[[str, str], Path]) -> None:
    as_yaml = load_scenario(write("s.yaml", ISSUE_EXAMPLE))
    as_json = load_scenario(write("s.json", json.dumps(yaml.safe_load(ISSUE_EXAMPLE))))
    assert as_json.nodes == as_yaml.nodes
    assert as_json.teams == as_yaml.teams
    pairs = [(j.job, j.duration) for j in as_json.jobs()]
    assert pairs == [(j.job, j.duration) for j in as_yaml.jobs()]


def test_omitted_fields_take_the_documented_defaults(write: Callable[[str, str], Path]) -> None:
    scenario = load_scenario(
        write(
            "defaults.yaml",
            """
            nodes: [{}]
            jobs: [{}, {gpus: 0.25}, {gpus: 0}]
            """,
        )
    )
    [node] = scenario.nodes
    assert (node.name, len(node.gpus), node.gpus[0].model) == ("node", 1, "GPU")
    assert (node.gpus[0].vram_bytes, node.cpus) == (24 * GIB, 8)
    plain, share, cpu = (j for j in scenario.jobs())
    assert plain.job.id == "job-1"
    assert plain.duration is None  # runs until the end
    assert plain.job.submitted_at == 0
    assert (plain.job.resources.gpus, plain.job.resources.cpus) == (1, 1)
    assert (plain.job.team, plain.job.user, plain.job.priority) == (
        DEFAULT_TEAM,
        "anonymous",
        "free",
    )
    assert (plain.job.preemptible, plain.job.replicas) == (True, 1)
    assert share.job.resources.gpu_milli == MILLI // 4
    assert not cpu.job.resources.wants_gpu
    assert scenario.until is None
    assert scenario.seed == 0
    assert scenario.cycle_interval_s == 0
    assert scenario.config == Config()
    assert scenario.auto_teams  # no teams declared: any team name is accepted


def test_config_knobs_and_priority_classes_are_read(write: Callable[[str, str], Path]) -> None:
    scenario = load_scenario(
        write(
            "config.yaml",
            """
            nodes: [{gpus: 2}]
            config:
              preemption: false
              min_runtime_before_preemption_s: 5
              priority_classes:
                - {name: gold, rank: 2, can_preempt: true}
                - {name: tin, rank: 1}
            jobs: [{priority: gold}]
            """,
        )
    )
    assert scenario.config.preemption is False
    assert scenario.config.min_runtime_before_preemption_s == 5
    assert [c.name for c in scenario.config.priority_classes] == ["gold", "tin"]
    assert next(scenario.jobs()).job.priority == "gold"


def test_inline_jobs_are_replayed_in_submit_order(write: Callable[[str, str], Path]) -> None:
    scenario = load_scenario(
        write(
            "order.yaml",
            """
            nodes: [{}]
            jobs: [{id: late, submit_at: 9}, {id: early, submit_at: 1}, {id: tie, submit_at: 9}]
            """,
        )
    )
    assert [j.job.id for j in scenario.jobs()] == ["early", "late", "tie"]


BAD = [
    # (narrative id, scenario text, wanted field, wanted place in the message)
    ("negative-gpus", "jobs: [{id: x, gpus: -1}]", "gpus", "jobs[0] (line 2)"),
    ("whole-gpus-with-a-fraction", "jobs: [{gpus: 1.5}]", "gpus", "line 2"),
    ("cpus-finer-than-a-milli-cpu", "jobs: [{cpus: 0.0005}]", "cpus", "line 2"),
    ("cpus-as-words", "jobs: [{cpus: lots}]", "cpus", "line 2"),
    ("negative-node-cpus", "nodes: [{cpus: -2}]", "cpus", "nodes[0]"),
    ("typo-in-a-field", "jobs: [{id: x, gpu: 2}]", "gpu", "jobs[0]"),
    ("unknown-priority", "jobs: [{priority: urgent}]", "priority", "line 2"),
    ("zero-duration", "jobs: [{duration: 0}]", "duration", "line 2"),
    ("text-for-a-number", "jobs: [{submit_at: soon}]", "submit_at", "line 2"),
    ("not-a-bool", "jobs: [{preemptible: maybe}]", "preemptible", "line 2"),
    ("zero-replicas", "jobs: [{replicas: 0}]", "replicas", "line 2"),
    ("duplicate-job-id", "jobs: [{id: x}, {id: x}]", "id", "jobs[1]"),
    ("undeclared-team", "teams: [{name: a}]\njobs: [{team: b}]", "team", "line 3"),
    ("team-without-name", "teams: [{quota_gpus: 2}]", "name", "teams[0] (line 2)"),
    ("negative-quota", "teams: [{name: a, quota_gpus: -2}]", "quota_gpus", "teams[0]"),
    ("unknown-config-knob", "config: {preempt: true}", "preempt", "config"),
    ("unknown-top-level-key", "node: []", "node", "scenario"),
    ("negative-until", "until: -5", "until", "scenario"),
]


@pytest.mark.parametrize(
    ("text", "want_field", "want_where"),
    [pytest.param(text, field, where, id=name) for name, text, field, where in BAD],
)
def test_bad_scenarios_name_the_field_and_where_it_is(
    write: Callable[[str, str], Path], text: str, want_field: str, want_where: str
) -> None:
    path = write("bad.yaml", "nodes: [{gpus: 4}]\n" + text + "\n")
    with pytest.raises(SimInputError) as info:
        list(load_scenario(path).jobs())
    assert info.value.field == want_field
    assert want_where in str(info.value), str(info.value)


def test_nodes_are_required_and_names_unique(write: Callable[[str, str], Path]) -> None:
    with pytest.raises(SimInputError, match="at least one node"):
        load_scenario(write("empty.yaml", "jobs: []\n"))
    with pytest.raises(SimInputError, match="used twice"):
        load_scenario(write("twice.yaml", "nodes: [{name: a}, {name: a}]\n"))


def test_json_errors_give_the_job_position_and_id(write: Callable[[str, str], Path]) -> None:
    path = write(
        "bad.json", json.dumps({"nodes": [{}], "jobs": [{"id": "ok"}, {"id": "x", "gpus": -1}]})
    )
    with pytest.raises(SimInputError) as info:
        load_scenario(path)
    assert info.value.field == "gpus"
    assert "jobs[1] (id 'x')" in str(info.value)


def test_broken_yaml_and_json_say_which_line(write: Callable[[str, str], Path]) -> None:
    with pytest.raises(SimInputError, match="line 2"):
        load_scenario(write("broken.yaml", "nodes: [{}]\njobs: [{id: a}}]\n"))
    with pytest.raises(SimInputError, match="line 2"):
        load_scenario(write("broken.json", '{"nodes":\n  [}'))


def test_cpus_are_counted_to_a_milli_cpu(write: Callable[[str, str], Path]) -> None:
    # the Alibaba trace asks for 11.4 CPUs, Kubernetes users for "500m"
    scenario = load_scenario(
        write(
            "cpus.yaml",
            "nodes: [{cpus: 12.5, gpus: 1}]\n"
            "jobs: [{id: trace, cpus: 11.4, gpus: 0}, {id: k8s, cpus: 500m, gpus: 0}]\n",
        )
    )
    assert scenario.nodes[0].cpus == 12.5
    jobs = {j.job.id: j.job.resources for j in scenario.jobs()}
    assert (jobs["trace"].cpu_milli, jobs["k8s"].cpu_milli) == (11_400, 500)
