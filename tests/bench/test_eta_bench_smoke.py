"""A small run of ``bench/eta.py`` so the benchmark keeps working (figures are not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "eta.py"


def test_bench_eta_prints_the_start_error_relative_to_the_wait() -> None:
    args = [sys.executable, str(BENCH), "--nodes", "2", "--jobs", "120", "--load", "1.5"]
    args += ["--seeds", "2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    figures = r"median \d+ s = \d+% of the wait, p90 \d+ s = \d+% of the wait$"
    assert re.search(
        r"^eta start error \(2 nodes, 120 jobs, load 1\.5, seed 1\): " + figures, out.stdout, re.M
    ), out.stdout
    share = r"\w+ \d+% \(p90 \d+%, \d+ rated\)"
    assert re.search(rf"^  by class: {share}(, {share})*$", out.stdout, re.M), out.stdout
    assert re.search(rf"^  by size: {share}(, {share})*$", out.stdout, re.M), out.stdout
    assert re.search(r"^goal met on [012] of 2 traces$", out.stdout, re.M), out.stdout
    assert re.search(
        r"^rated \d+ of \d+ jobs that started \(\d+ predicted\); goal: ", out.stdout, re.M
    )
