"""A small run of ``bench/parity.py`` so the benchmark keeps working: one scenario through
``corral sim`` and a real server with ``--fake-gpus`` agents, compared side by side."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_bench_parity_prints_both_runs_and_the_verdict() -> None:
    scenario = ROOT / "tests" / "sim" / "parity" / "borrowing.yaml"
    args = [sys.executable, str(ROOT / "bench" / "parity.py"), str(scenario)]
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(
        r"^jobs \(team/user/priority/gpus/replicas/submit/duration\)\s+sim\s+server$",
        out.stdout,
        re.M,
    ), out.stdout
    assert re.search(
        r"^a/anonymous/free/1 GPU @0.5s/1.0 waits\s+1.5,1.5\s+[\d.]+,[\d.]+$", out.stdout, re.M
    ), out.stdout
    assert re.search(r"^preemptions\s+0\s+0$", out.stdout, re.M), out.stdout
    assert out.stdout.rstrip().endswith("parity: ok"), out.stdout
