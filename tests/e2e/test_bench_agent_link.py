"""bench/agent_link.py at a tiny size, so the benchmark cannot rot (figures are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_agent_link_bench_runs_every_shape_and_prints_cpu_per_job() -> None:
    argv = [sys.executable, "agent_link.py", "--agents", "1", "--jobs", "20", "--idle", "5"]
    argv += ["--clients", "2", "--warmup", "0"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    shapes = [line.split()[0] for line in out.stdout.splitlines() if line[:1].isalpha()]
    assert {"idle", "concurrent", "batch"} <= set(shapes), out.stdout
