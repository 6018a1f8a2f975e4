"""Time passing alone wakes the simulator, as it wakes the server (issue 48, item 1).

The scheduler's answer can change with nothing arriving or ending: a victim
passes its minimum run time, a retry backoff ends, a job's wait for its
model's holder runs out (``corral.scheduler.timers``). Each scenario here
has such an instant and checks, through ``corral sim --json``, that the run
acted on it then.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from simtest import SCENARIOS, SimRun


def _preempted_at(run: SimRun) -> list[float]:
    return sorted(
        p["end"] for j in run.report["jobs"] for p in j["placements"] if p.get("preempted")
    )


@pytest.mark.parametrize("policy", ["corral", "corral-rebuild"])
def test_a_reclaim_waits_for_the_minimum_run_time_and_then_happens(
    run_sim: Callable[..., SimRun], policy: str
) -> None:
    run = run_sim(SCENARIOS / "reclaim_after_min_runtime.yaml", "--policy", policy)
    b = [run.job(f"b{i}") for i in range(1, 6)]
    placed = sorted(j["wait_s"] for j in b if j["wait_s"] is not None)
    # b1 fits in the room a left at once; the others wait for a's work to reach 60 s, no
    # longer (before the wake they waited for ever: nothing arrives or ends after t=20)
    assert placed[0] == 0.0
    assert len(placed) >= 4  # b holds at least 16 of its 20 GPUs
    assert set(placed[1:]) == {40.0}
    preempted = _preempted_at(run)
    assert len(preempted) == run.summary["preemptions"] >= 3
    assert set(preempted) == {60.0}
    assert run.summary["quota_violations"] == 0
