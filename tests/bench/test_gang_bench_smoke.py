"""A small run of ``bench/gang.py`` so the benchmark keeps working (figures are not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gang.py"


def test_bench_gang_prints_cold_and_warm_starts_recovery_and_lost_steps() -> None:
    args = [sys.executable, str(BENCH), "--replicas", "2", "--steps", "30", "--node-timeout", "2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^gang of 2: succeeded after 2 attempts$", out.stdout, re.M), out.stdout
    start = r"^placement -> all ranks in init_process_group: cold [\d.]+ s, warm [\d.]+ s "
    assert re.search(start + r"\(warm/cold [\d.]+\)$", out.stdout, re.M), out.stdout
    assert re.search(r"^node loss -> training again: [\d.]+ s \(node_timeout 2 s", out.stdout, re.M)
    assert re.search(r"^lost steps: \d+ of \d+ run \([\d.]+%\)$", out.stdout, re.M)
