"""bench/agents.py at a tiny size: a real server holds 20 agent clients and reports its figures."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "agents.py"


def test_bench_holds_agents_and_prints_cpu_and_lag(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_agents", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_agents"] = module
    spec.loader.exec_module(module)
    assert (
        module.main(["--agents", "20", "--seconds", "1.5", "--ramp", "20", "--settle", "0.2"]) == 0
    )
    out = capsys.readouterr().out
    assert re.search(r"^agents connected: 20/20 in [\d.]+ s$", out, re.MULTILINE), out
    beats = re.search(r"^heartbeats/s: (\d+)$", out, re.MULTILINE)
    assert beats is not None, out
    assert int(beats.group(1)) > 0  # they really heartbeat (no rate asserted: timing-free)
    assert re.search(r"^server CPU: \d+ % of one core$", out, re.MULTILINE), out
    assert re.search(r"^heartbeat lag: mean [\d.]+ ms, p50 <= \d+ ms", out, re.MULTILINE), out
    assert re.search(r"^nodes lost during the run: 0$", out, re.MULTILINE), out
