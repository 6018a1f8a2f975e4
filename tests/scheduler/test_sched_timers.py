"""``Scheduler.wake_at``: the first instant at which time alone changes the plan.

Each case checks both halves of the promise: a cycle just before the instant
does not do what a cycle at it does (so waking later would lose time), and the
instant is the one given (so both shells wake exactly then).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from scheduler_builders import alloc, job, node, snapshot, team

from corral.scheduler import Config, Plan, Scheduler

MIN_RUN = Config().min_runtime_before_preemption_s


@dataclass(frozen=True)
class Case:
    name: str
    sched: Scheduler
    now: float
    want_wake: float | None


def _reclaim(*, preemptible: bool = True) -> Scheduler:
    """a holds the only node's 4 GPUs on borrowed capacity since t=10; b's job, within b's
    quota, needs them."""
    snap = snapshot(
        nodes=[node("n1").gpus(4)],
        allocs=[
            alloc("x", "n1")
            .cards(0, 1, 2, 3)
            .set(team="a", borrowed=True, started_at=10.0, preemptible=preemptible)
        ],
        jobs=[job("b1").gpus(4).set(team="b", submitted_at=12.0)],
        teams=[team("a", 0, 4), team("b", 4, 0)],
    )
    return Scheduler.from_snapshot(snap)


def _backoff() -> Scheduler:
    snap = snapshot(
        nodes=[node("n1").gpus(1)],
        jobs=[job("j1").gpus(1).set(submitted_at=0.0, not_before=50.0, attempt=2)],
    )
    return Scheduler.from_snapshot(snap)


def _model_wait() -> Scheduler:
    """j waits for the busy node that has its model loaded (expected free at t=10) rather
    than fetch the 6.5 GB model onto the idle node (~71 s), up to model_max_wait_s = 300
    after its submission; the holder overruns."""
    config = Config(model_fetch_bytes_per_s=100e6, model_max_wait_s=300)
    snap = snapshot(
        nodes=[node("holder").gpus(1).models(loaded=("sdxl",)), node("idle").gpus(1)],
        allocs=[alloc("busy", "holder").cards(0).set(started_at=0.0, preemptible=False)],
        jobs=[job("j").gpus(1).set(model="sdxl", estimated_runtime_s=30.0, submitted_at=0.0)],
    )
    snap = replace(snap, expected_ends={"busy": 10.0}, model_sizes={"sdxl": 6_500_000_000})
    return Scheduler.from_snapshot(snap, config)


def _acted(plan: Plan) -> bool:
    return bool(plan.placements or plan.preemptions)


CASES = [
    Case("a reclaim waits for the victim's minimum run time", _reclaim(), 20.0, 10.0 + MIN_RUN),
    Case("a backoff ends", _backoff(), 10.0, 50.0),
    Case("a wait for the model's holder runs out", _model_wait(), 5.0, 300.0),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_time_alone_changes_the_plan_exactly_at_wake_at(case: Case) -> None:
    wake = case.sched.wake_at(case.now)
    assert wake == case.want_wake
    assert wake is not None
    assert not _acted(case.sched.schedule(case.now))
    assert not _acted(case.sched.schedule(wake - 0.001))
    assert _acted(case.sched.schedule(wake))


def test_nothing_to_wake_for() -> None:
    # work that may never be preempted, an empty queue, a victim gone: no instant
    assert _reclaim(preemptible=False).wake_at(20.0) is None
    sched = _reclaim()
    sched.end("x")
    assert sched.wake_at(20.0) is None
    sched = _reclaim()
    sched.withdraw("b1")
    assert sched.wake_at(20.0) is None
    assert _reclaim().wake_at(10.0 + MIN_RUN) is None  # passed: a cycle now sees it
