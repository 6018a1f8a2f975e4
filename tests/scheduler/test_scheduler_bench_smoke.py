"""The scheduler benchmark runs end to end at a tiny size and prints its figure lines."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler.py"


def test_bench_prints_placements_per_second_and_latency(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_scheduler", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scheduler"] = module
    spec.loader.exec_module(module)
    assert module.main(["--repeat", "1", "--sizes", "20x100,30x50", "--reclaim", "10x20"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^placements/s \(20 nodes, 100 queued\): \d+$", out, re.MULTILINE)
    assert re.search(r"^placements/s \(30 nodes, 50 queued\): \d+$", out, re.MULTILINE)
    assert re.search(r"^cycle latency \(20 nodes, 100 queued\): [\d.]+ ms", out, re.MULTILINE)
    reclaim = re.search(
        r"^cycle latency \(10 nodes, 20 queued, reclaim\): .*preemptions (\d+)", out, re.M
    )
    assert reclaim is not None
    assert int(reclaim.group(1)) > 0
