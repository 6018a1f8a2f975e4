"""The generated trace drawn ahead by a forked process (``generate.trace(ahead=True)``):
the same jobs as drawn here, in chunks; a consumer that stops early ends the drawer; a
drawer that fails is an error, not a short trace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.sim import generate
from corral.sim.scenario import SimJob

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the drawer is forked")


def _fields(sim_job: SimJob) -> tuple[object, ...]:
    j = sim_job.job
    return (
        j.id,
        j.resources,
        j.priority,
        j.team,
        j.user,
        j.replicas,
        j.submitted_at,
        j.estimated_runtime_s,
        sim_job.duration,
        type(sim_job.duration),
    )


def test_drawn_ahead_the_jobs_are_those_drawn_here_across_chunks() -> None:
    shape = generate.TraceShape(jobs=2 * generate.CHUNK + 123, total_gpus=64, seed=11)
    here = [_fields(s) for s in generate.trace(shape)]
    ahead = [_fields(s) for s in generate.trace(shape, ahead=True)]
    assert len(ahead) == shape.jobs
    assert ahead == here
    # the ids count on across chunks (made as the jobs are, from a thousands' prefix)
    assert [f[0] for f in ahead] == [f"g{n}" for n in range(1, shape.jobs + 1)]
    assert {f[9] for f in ahead} <= {int, float}  # whole seconds kept as the draw gave them


def test_without_estimates_the_jobs_have_none_either_way() -> None:
    shape = generate.TraceShape(jobs=500, total_gpus=16, seed=2, estimates=None)
    ahead = list(generate.trace(shape, ahead=True))
    assert all(s.job.estimated_runtime_s is None for s in ahead)
    assert [_fields(s) for s in ahead] == [_fields(s) for s in generate.trace(shape)]


CHILDREN = """
import os
from pathlib import Path
from corral.sim import generate

def children():  # this process's child processes
    found = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        found.update(int(pid) for pid in task.read_text().split())
    return found
"""

STOPPING = (
    CHILDREN
    + """
stream = generate.trace(generate.TraceShape(jobs=500_000, total_gpus=64), ahead=True)
first = [next(stream).job.id for _ in range(10)]
drawing = children()
stream.close()  # what a run stopping at ``until`` does to its trace
print(first == [f"g{n}" for n in range(1, 11)], len(drawing), len(children()))
"""
)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="children listed in /proc")
def test_a_consumer_that_stops_early_ends_the_drawer() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STOPPING], capture_output=True, text=True, check=True, timeout=60
    )
    # the first jobs came in order from one drawer, killed and reaped once closed
    assert done.stdout.split() == ["True", "1", "0"]


UNTIL = (
    CHILDREN
    + """
from corral.sim.runner import simulate

scenario = generate.scenario(8, 200_000, cycle_interval_s=60.0, ahead=True)
summary = simulate(scenario, "corral", until=600.0)  # stops long before the trace ends
print(summary["jobs_total"] < 200_000, len(children()))
"""
)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="children listed in /proc")
def test_a_run_that_stops_at_until_ends_its_drawer() -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNTIL], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["True", "0"]  # the runner closed its arrivals


FAILING = """
import sys
from corral.sim import generate
broken = generate.TraceShape(jobs=100, total_gpus=16, load=0.0)  # no arrival rate
try:
    list(generate.trace(broken))
except ZeroDivisionError:
    print("here: ZeroDivisionError")
try:
    list(generate.trace(broken, ahead=True))
except RuntimeError as exc:
    print(f"ahead: {exc}")
"""


def test_a_drawer_that_fails_is_an_error_naming_the_shortfall() -> None:
    # in a process of its own: one with threads running (as a test run may have, from
    # earlier tests) draws in process and never forks
    done = subprocess.run(
        [sys.executable, "-c", FAILING], capture_output=True, text=True, check=True, timeout=60
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "here: ZeroDivisionError"  # drawn here: the error itself
    assert lines[1].startswith("ahead: the trace's drawer (pid ")
    assert lines[1].endswith("stopped 100 jobs short")
    assert "ZeroDivisionError" in done.stderr  # the drawer's own traceback
