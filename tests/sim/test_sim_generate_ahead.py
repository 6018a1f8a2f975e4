"""The generated trace drawn ahead by a forked process (``generate.trace(ahead=True)``):
the same jobs as drawn here, in chunks; a consumer that stops early ends the drawer; a
drawer that fails is an error, not a short trace."""

from __future__ import annotations

import os
import threading
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


def _children() -> set[int]:
    """This process's child processes (Linux: /proc), or an empty set where unknown."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        found.update(int(pid) for pid in task.read_text().split())
    return found


def test_drawn_ahead_the_jobs_are_those_drawn_here_across_chunks() -> None:
    shape = generate.TraceShape(jobs=2 * generate.CHUNK + 123, total_gpus=64, seed=11)
    here = [_fields(s) for s in generate.trace(shape)]
    ahead = [_fields(s) for s in generate.trace(shape, ahead=True)]
    assert len(ahead) == shape.jobs
    assert ahead == here
    assert {f[9] for f in ahead} <= {int, float}  # whole seconds kept as the draw gave them


def test_without_estimates_the_jobs_have_none_either_way() -> None:
    shape = generate.TraceShape(jobs=500, total_gpus=16, seed=2, estimates=None)
    ahead = list(generate.trace(shape, ahead=True))
    assert all(s.job.estimated_runtime_s is None for s in ahead)
    assert [_fields(s) for s in ahead] == [_fields(s) for s in generate.trace(shape)]


def test_a_consumer_that_stops_early_ends_the_drawer() -> None:
    before = _children()
    stream = generate.trace(generate.TraceShape(jobs=500_000, total_gpus=64), ahead=True)
    first = [next(stream) for _ in range(10)]
    assert [s.job.id for s in first] == [f"g{n}" for n in range(1, 11)]
    stream.close()  # what a run stopping at ``until`` does to its trace
    assert _children() == before  # killed and reaped: nothing left running or a zombie


def test_a_drawer_that_fails_is_an_error_naming_the_shortfall(
    capfd: pytest.CaptureFixture[str],
) -> None:
    if threading.active_count() > 1:
        pytest.skip("threads are running (an earlier test's): the drawer would not be forked")
    broken = generate.TraceShape(jobs=100, total_gpus=16, load=0.0)  # no arrival rate
    with pytest.raises(ZeroDivisionError):
        list(generate.trace(broken))  # drawn here: the error itself
    with pytest.raises(RuntimeError, match="stopped 100 jobs short"):
        list(generate.trace(broken, ahead=True))
    assert "ZeroDivisionError" in capfd.readouterr().err  # the drawer's own traceback
