"""Memory requests in the simulator: the scenario format reads them as the API does, and a
job waits for a node with the memory free, under corral's scheduler and the baselines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from simtest import SCENARIOS, SimRun

from corral.core import GIB
from corral.sim.errors import SimInputError
from corral.sim.loaders import load_scenario
from corral.sim.traces import job_record


def test_memory_reads_as_the_api_takes_it(write: Callable[[str, str], Path]) -> None:
    scenario = load_scenario(
        write(
            "memory.yaml",
            "nodes: [{name: big, memory: 1Ti}, {name: plain, gpus: 2}]\n"
            "jobs: [{id: k8s, memory: 512Mi}, {id: bytes, memory: 4096}, {id: none}]\n",
        )
    )
    big, plain = scenario.nodes
    assert big.memory_bytes == 1024 * GIB
    assert plain.memory_bytes == 128 * GIB  # the default: 64 GiB per GPU
    jobs = {j.job.id: j for j in scenario.jobs()}
    assert jobs["k8s"].job.resources.memory_bytes == 512 * 1024**2
    assert jobs["bytes"].job.resources.memory_bytes == 4096
    assert jobs["none"].job.resources.memory_bytes == 0
    assert job_record(jobs["k8s"])["memory"] == 512 * 1024**2  # written back to a trace
    assert "memory" not in job_record(jobs["none"])


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("nodes: [{}]\njobs: [{memory: lots}]\n", "line 2"),
        ("nodes: [{}]\njobs: [{memory: 500m}]\n", "line 2"),
        ("nodes: [{memory: -1}]\n", "nodes[0]"),
    ],
)
def test_bad_memory_names_the_field_and_where(
    write: Callable[[str, str], Path], text: str, where: str
) -> None:
    with pytest.raises(SimInputError) as info:
        list(load_scenario(write("bad.yaml", text)).jobs())
    assert info.value.field == "memory"
    assert where in str(info.value)


@pytest.mark.parametrize("policy", ["corral", "first-fit", "best-fit"])
def test_a_job_waits_for_free_memory_beside_free_gpus(
    run_sim: Callable[..., SimRun], policy: str
) -> None:
    run = run_sim(SCENARIOS / "memory_bound.yaml", "--policy", policy)
    assert run.job("a")["wait_s"] == 0
    assert run.job("b")["wait_s"] == 0
    assert run.job("c")["wait_s"] == pytest.approx(99)  # until a ends at 100, not before
    assert run.job("d")["wait_s"] == 0  # 12 GiB of the 16 left: it fits at once
    assert run.job("huge")["state"] == "queued"  # more than the node has: never runs
