"""A tiny run of ``bench/api.py`` so the benchmark keeps working (figures are not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "api.py"


def test_bench_api_prints_submission_rates() -> None:
    args = [
        sys.executable,
        str(BENCH),
        "--jobs",
        "30",
        "--concurrency",
        "3",
        "--batch-size",
        "10",
        "--db",
        "sqlite",
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rates = re.findall(
        r"^sqlite\s+(single|batch):\s+([\d,]+) submissions/s", out.stdout, re.MULTILINE
    )
    assert [shape for shape, _ in rates] == ["single", "batch"]
    assert all(int(rate.replace(",", "")) > 0 for _, rate in rates)
