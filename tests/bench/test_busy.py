"""bench/busy.py: the end-to-end benchmark says when other processes shared the machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import busy  # noqa: E402

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def stat(user: int, system: int, idle: int, iowait: int = 0) -> str:
    return STAT.format(user=user, system=system, idle=idle, iowait=iowait)


def test_busy_ticks_leave_out_idle_and_iowait() -> None:
    assert busy.cpu_ticks(stat(100, 50, 800, 50)) == (150, 1000)


def test_other_processes_cores_leave_out_this_process_s_own() -> None:
    before, after = busy.cpu_ticks(stat(0, 0, 0)), busy.cpu_ticks(stat(150, 50, 200))
    # 200 busy ticks at 100 Hz over 2 s: 1 core; this process used 0.5 s of it.
    assert busy.others_cores(before, after, own_s=0.5, seconds=2.0, hz=100) == 0.75
    assert busy.others_cores(before, after, own_s=5.0, seconds=2.0, hz=100) == 0.0


def test_a_warning_only_past_the_threshold() -> None:
    assert busy.warning("before", None) is None
    assert busy.warning("before", busy.BUSY_CORES) is None
    line = busy.warning("after", 0.9)
    assert line is not None
    assert "0.90 cores after the run" in line


def test_a_cpu_bound_process_beside_it_is_seen() -> None:
    spin = [sys.executable, "-c", "while True: pass"]
    with subprocess.Popen(spin) as hog:
        try:
            cores = busy.sample(0.5)
        finally:
            hog.kill()
    assert cores is not None
    assert cores > busy.BUSY_CORES
