"""Is anything else using the CPU? ``bench/e2e.py`` warns when it is.

A CPU-bound process beside the benchmark, even a niced one, slows Celery's chain (a
process wakes for every step of every task) far more than corral's, whose work arrives
in batches: beside one, ``bench/e2e.py`` printed throughput ratios of 2.0-2.6 where the
quiet machine gives 1.65. So the benchmark samples the machine before and after its run
and says when the figures are not a quiet machine's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_CORES = 0.25
"""Other processes using more than this many cores' worth of CPU: the machine is busy."""


def cpu_ticks(stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from the text of ``/proc/stat``: busy is all
    but idle and iowait."""
    fields = [int(v) for v in stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is counted in user time already
    return total - idle, total


def others_cores(
    before: tuple[int, int], after: tuple[int, int], own_s: float, seconds: float, hz: int
) -> float:
    """Cores' worth of CPU that processes other than this one used between two samples."""
    if seconds <= 0:
        return 0.0
    busy_s = (after[0] - before[0]) / hz
    return max(0.0, busy_s - own_s) / seconds


def sample(seconds: float = 1.0) -> float | None:
    """Cores' worth of CPU other processes use over ``seconds`` (None: no ``/proc/stat``)."""
    stat = Path("/proc/stat")
    try:
        before = cpu_ticks(stat.read_text())
    except OSError:
        return None
    own0, t0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    after = cpu_ticks(stat.read_text())
    own_s, elapsed = time.process_time() - own0, time.monotonic() - t0
    return others_cores(before, after, own_s, elapsed, os.sysconf("SC_CLK_TCK"))


def warning(when: str, cores: float | None) -> str | None:
    """The line to print when the machine was busy ``when`` (None: it was quiet)."""
    if cores is None or cores <= BUSY_CORES:
        return None
    return (
        f"warning: other processes used {cores:.2f} cores {when} the run: the figures are not "
        "a quiet machine's, and such load slows Celery more than corral"
    )
