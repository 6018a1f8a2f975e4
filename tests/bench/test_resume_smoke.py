"""bench/resume.py, short: ComfyUI samples whose machine is killed with kill -9 resume
elsewhere from their last segment, and end as an uninterrupted run's images."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_a_short_kill_run_resumes_every_job_to_the_same_image() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "resume.py"), "--jobs", "2", "--steps", "12"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert figures["identical results"] == "2/2"
    # a kill before a job's first segment ends has no checkpoint to resume from; one at
    # least comes later (the kill steps are seeded)
    assert figures["resumed from a checkpoint"] != "0/2", "every resume restarted from step 0"
    assert figures["work redone"].endswith("of the steps (goal <= 15%)")
    assert "goal under node_timeout + 5 s" in figures["kill to sampling again"]
