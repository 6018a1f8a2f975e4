"""The model simulator: swaps, downloads and waits with model-aware and model-blind routing,
and a tiny run of ``bench/models.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from corral.sim.model_world import ModelWorkload, run

ROOT = Path(__file__).resolve().parents[2]
SMALL = ModelWorkload(jobs=300, nodes=6, models=12, load=0.6, seed=3)


def test_model_aware_routing_swaps_and_waits_less_than_ignoring_models() -> None:
    aware, blind = run(SMALL, "aware").summary(), run(SMALL, "blind").summary()
    assert aware["jobs"] == blind["jobs"] == 300
    assert aware["swaps_per_job"] < blind["swaps_per_job"]
    assert aware["downloads_per_job"] < blind["downloads_per_job"]
    assert aware["wait_p95_s"] < blind["wait_p95_s"]
    assert blind["prefetches"] == 0


def test_every_job_runs_once_and_a_run_is_deterministic() -> None:
    for mode in ("aware", "locality", "blind"):
        first, again = run(SMALL, mode), run(SMALL, mode)
        assert len(first.waits) == SMALL.jobs  # every job started exactly once
        assert first.summary() == again.summary()
        assert min(first.waits) >= 0


def test_with_one_model_each_node_fetches_and_loads_it_once() -> None:
    one = ModelWorkload(jobs=120, nodes=4, models=1, load=0.5, seed=1)
    for mode in ("aware", "blind"):
        report = run(one, mode)
        assert report.downloads + report.prefetches <= one.nodes  # at most once per node
        assert report.downloads <= report.swaps <= one.nodes  # then it stays loaded


def test_the_bench_runs_small_and_prints_its_figures() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "models.py"), "--jobs", "120", "--nodes", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "swaps per job (model-aware / locality only / model-blind): " in out
    assert "wait p95 s (model-aware / locality only / model-blind): " in out
