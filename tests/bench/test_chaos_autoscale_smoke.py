"""bench/chaos_autoscale.py, short: real server kills, a lagging provider list and real agents,
and the figures that must hold at any size (no machine beyond max_nodes, nothing lost or
completed twice)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
pytestmark = pytest.mark.slow


def test_a_short_chaos_run_overspends_nothing_and_draws_its_figure(tmp_path: Path) -> None:
    out = tmp_path / "chaos.png"
    argv = [sys.executable, str(BENCH / "chaos_autoscale.py"), "--minutes", "0.3", "--peak", "8",
            "--job-s", "1.5", "--kills", "1", "--down-s", "2", "--lag-s", "3", "--idle-s", "2",
            "--drain-s", "90", "--out", str(out)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert figures["overspend"].startswith("0 machine-seconds beyond max_nodes")
    assert figures["lost"] == "0"
    assert figures["completed twice"] == "0"
    assert figures["server kills"] == "1"
    assert "idle_s 2" in figures["idle machine-seconds"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
