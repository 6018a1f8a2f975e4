"""Records made per job are marked acyclic for the compiled build (``core/compiled.py``):
there, their instances are made without the cyclic collector's header and never tracked;
in pure Python the mark does nothing."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from corral.core.model import Allocation, Gpu, Job, Node
from corral.core.resources import GIB
from corral.scheduler import slots
from corral.scheduler.api import Placement
from corral.scheduler.capacity import Change, NodeCap
from corral.scheduler.fit import Fit
from corral.scheduler.scorers import Candidate
from corral.scheduler.victims import TeamEvictable
from corral.sim import world
from corral.sim.clock import Timer
from corral.sim.scenario import SimJob

ROOT = Path(__file__).resolve().parents[2]


def _compiled() -> bool:
    return world.__file__ is not None and not world.__file__.endswith(".py")


def test_per_job_records_are_untracked_exactly_when_compiled() -> None:
    job = Job(id="j1", submitted_at=3.0)
    alloc = Allocation(id="a1", job_ids=("j1",), node="n1", gpu_indices=(0,), gpu_milli=1000)
    records = [
        job,
        alloc,
        SimJob(job, 60.0, "t:1"),
        world.JobRun(job, 60.0, "t:1"),
        Timer(5.0, 1, "j1", 1),
        Placement("a1", ("j1",), "n1", gpu_indices=(0,), gpu_milli=1000),
        slots.Slot(alloc, 65.0, 0, 0),
    ]
    # made per placement tried, freed within the cycle: nothing to unlink from the GC's list
    node = _node_cap()
    fit = Fit(node, (0,), 1000, 0, 4)
    records += [fit, Candidate(fit, 0, None), Change(0, node, (0,), 1000, 0, 4), TeamEvictable()]
    tracked = {type(r).__name__: gc.is_tracked(r) for r in records}
    want = not _compiled()  # pure Python tracks every instance with reference fields
    assert tracked == dict.fromkeys(tracked, want)


def _node_cap() -> NodeCap:
    gpus = tuple(Gpu(i, "A100", 80 * GIB) for i in range(2))
    return NodeCap(0, Node("n1", gpus=gpus, cpus=16), 0)


def test_the_mark_is_a_no_op_without_mypy_extensions() -> None:
    # A deployment without the compiled build need not install mypy_extensions.
    script = (
        "import sys; sys.modules['mypy_extensions'] = None\n"
        "from corral.core.compiled import mypyc_attr\n"
        "class C: pass\n"
        "assert mypyc_attr(acyclic=True)(C) is C\n"
        "from corral.core.model import Job\n"
        "assert Job(id='x').id == 'x'\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
