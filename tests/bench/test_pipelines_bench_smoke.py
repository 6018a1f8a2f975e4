"""A tiny run of ``bench/pipelines.py`` so the benchmark keeps working (figures are not
asserted): both ways print, and each decode ran where the way says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pipelines.py"


def test_bench_pipelines_prints_both_handovers() -> None:
    args = [sys.executable, str(BENCH), "--mib", "2", "--runs", "1"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = re.findall(
        r"^(same machine|other machine) +2 MiB: queued -> started p50 [\d.]+ ms, "
        r"end -> queued p50 [\d.]+ ms \(decode on (box-\w)\)$",
        out.stdout,
        re.MULTILINE,
    )
    assert rows == [("same machine", "box-a"), ("other machine", "box-b")]
