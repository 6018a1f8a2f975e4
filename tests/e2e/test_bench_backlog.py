"""bench/backlog.py at a tiny size, so the benchmark cannot rot (figures are not checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "backlog.py"


def test_the_backlog_bench_drains_each_depth_and_compares_them() -> None:
    args = [sys.executable, str(BENCH), "--depths", "20,60", "--agents", "1"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = re.findall(r"^sqlite\s+depth\s+([\d,]+): +([\d,]+) jobs/s", out.stdout, re.M)
    assert [depth for depth, _ in lines] == ["20", "60"]
    assert all(int(rate.replace(",", "")) > 0 for _, rate in lines)
    assert re.search(r"^sqlite\s+depth 60 / 20:\s+rate [\d.]+x", out.stdout, re.M), out.stdout
