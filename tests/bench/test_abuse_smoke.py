"""A tiny run of ``bench/abuse.py`` so the benchmark keeps working (figures are not asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "abuse.py"


def test_bench_abuse_prints_every_attack_and_the_summary() -> None:
    args = [sys.executable, str(BENCH), "--scale", "0.002", "--seconds", "2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    phases = re.findall(r"^(\w+)\s+\d+ in\s+[\d.]+ s \[", out.stdout, re.MULTILINE)
    assert phases == ["idle", "uploads", "options", "sse", "flood", "slow"]
    assert re.search(r"^healthz p99 under attack: [\d.]+ ms", out.stdout, re.MULTILINE)
    assert re.search(r"^5xx to well-behaved clients: \d+", out.stdout, re.MULTILINE)
    peak = re.search(r"^server peak descriptors: (\d+), peak RSS: (\d+) MB", out.stdout, re.M)
    assert peak is not None
    assert int(peak.group(1)) > 0
    assert int(peak.group(2)) > 0
