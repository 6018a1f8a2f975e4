"""Hash every plan corral's kept scheduler makes on the generated trace: a speed change
to the scheduler or the simulator must leave this line unchanged.

    python bench/sim_plans.py 100000                          # pure Python (src/)
    PYTHONPATH=build/native python bench/sim_plans.py 100000  # the compiled build

Runs the trace of ``bench/sim.py --jobs N`` (1,000 nodes x 8 GPUs, load 0.8, seed 0,
a cycle every 60 s, until the last arrival) through the ``corral`` policy, hashing
the ``repr`` of each cycle's ``Plan`` (placements, preemptions, unplaced) in order,
and prints which build ran, the number of plans and the hash, the summary's
allocation ratio, cycles, preemptions and waits, and jobs/s (for orientation only:
``bench/sim.py`` is the speed measure).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import corral.scheduler.incremental as incremental
from corral.scheduler.api import Config, Plan, Snapshot
from corral.sim import generate
from corral.sim.policies import Kept
from corral.sim.runner import simulate
from corral.sim.scenario import Scenario


class Hashing:
    """The ``corral`` policy (``Kept``), hashing each plan it returns. A wrapper, not a
    subclass: a compiled ``Kept`` cannot be subclassed by interpreted code."""

    def __init__(self, scenario: Scenario) -> None:
        self.kept = Kept(scenario)
        self.digest = hashlib.sha256()
        self.plans = 0

    def __getattr__(self, name: str) -> Any:
        """Every other event of the run (submitted, started, ended ...) goes to the policy."""
        return getattr(self.kept, name)

    def plan(
        self,
        snapshot: Callable[[], Snapshot],
        config: Config,
        now: float,
        seed: int,
        served: Mapping[str, float],
    ) -> Plan:
        plan = self.kept.plan(snapshot, config, now, seed, served)
        self.digest.update(repr(plan).encode())
        self.plans += 1
        return plan


def main(jobs: int) -> None:
    scenario = generate.scenario(
        1000, jobs, load=0.8, seed=0, cycle_interval_s=60.0, fragmentation_sample_s=3600.0
    )
    until = 0.0  # the last arrival, as bench/sim.py runs it
    for job in generate.trace(generate.TraceShape(jobs=jobs, total_gpus=8000, load=0.8)):
        until = job.submit_at
    policy = Hashing(scenario)
    started = time.perf_counter()
    summary = simulate(scenario, policy, until=until)
    elapsed = time.perf_counter() - started
    build = "compiled" if incremental.__file__.endswith(".so") else "pure Python"
    print(f"{build}: {jobs} jobs, {policy.plans} plans, hash {policy.digest.hexdigest()[:16]}")
    print(
        f"gpu_allocation_ratio {summary['gpu_allocation_ratio']:.4f}, "
        f"cycles {summary['cycles']}, preemptions {summary['preemptions']}, "
        f"wait p50/p95 s {summary['wait_p50_s']} / {summary['wait_p95_s']}, "
        f"{summary['jobs_total'] / elapsed:,.0f} jobs/s"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
