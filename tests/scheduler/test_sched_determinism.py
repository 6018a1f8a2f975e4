"""Equal inputs give equal plans, even across processes with different string hashing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import hashlib, sys
sys.path.insert(0, "bench")
from scheduler import make_reclaim, make_snapshot
from corral.scheduler import schedule
plans = [schedule(make_snapshot(60, 600), now=1000.0), schedule(make_reclaim(20, 40), now=5000.0)]
print(hashlib.sha256(repr(plans).encode()).hexdigest())
"""


def plan_digest(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_plans_do_not_depend_on_the_process_hash_seed() -> None:
    assert plan_digest("1") == plan_digest("2") == plan_digest("12345")
