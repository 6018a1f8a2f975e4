"""ETAs: run times learned from history (``Durations``) and the scheduler replayed forward
on them (``estimate``). Pure: microseconds per case."""

from __future__ import annotations

import pytest

from corral.core.model import Allocation, Gpu, Job, JobKind, Node
from corral.core.resources import GIB, ResourceRequest
from corral.core.states import AllocObserved
from corral.scheduler.api import Config, Snapshot
from corral.scheduler.durations import PRIOR_S, Durations
from corral.scheduler.eta import estimate

ONE = ResourceRequest(gpus=1)


def node(name: str, gpus: int = 1, model: str = "RTX 4090") -> Node:
    return Node(name, gpus=tuple(Gpu(i, model, 24 * GIB) for i in range(gpus)), cpus=16)


def running(
    alloc_id: str, job_id: str, on: str, *, started: float = 0.0, **kw: object
) -> Allocation:
    return Allocation(
        alloc_id, (job_id,), on, gpu_indices=(0,), gpu_milli=1000, started_at=started,
        observed=AllocObserved.RUNNING, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def learned(*seconds: float, job: Job | None = None, gpu: str = "RTX 4090") -> Durations:
    d = Durations()
    for s in seconds:
        d.record(job or Job("done", kind=JobKind.SAMPLE, backend="comfyui"), gpu, s)
    return d


def test_nothing_finished_yet_predicts_the_default_or_the_job_s_own_estimate() -> None:
    d = Durations()
    assert d.predict(Job("a")) == (PRIOR_S, "default")
    assert d.predict(Job("a", estimated_runtime_s=120)) == (120, "estimate")
    assert d.predict(Job("a", estimated_runtime_s=120, timeout_s=60)) == (60, "estimate")


def test_the_median_ignores_an_outlier() -> None:
    d = learned(30, 31, 29, 30, 30, 86_400)
    seconds, basis = d.predict(Job("a", kind=JobKind.SAMPLE, backend="comfyui"), "RTX 4090")
    assert basis == "history"
    assert 29 < seconds < 32, seconds


def test_a_key_seen_rarely_is_shrunk_towards_coarser_history() -> None:
    d = learned(*[100.0] * 50, job=Job("t", kind=JobKind.TRAIN))
    d.record(Job("s", kind=JobKind.SAMPLE), "RTX 4090", 10.0)
    sample, _ = d.predict(Job("x", kind=JobKind.SAMPLE), "RTX 4090")
    train, _ = d.predict(Job("y", kind=JobKind.TRAIN), "RTX 4090")
    assert 10 < sample < 100, "one sample nudges, it does not decide"
    assert train == pytest.approx(100, rel=0.02)


def test_padded_estimates_are_read_as_padded() -> None:
    d = Durations()
    for k in range(20):
        d.record(Job(f"j{k}", estimated_runtime_s=600), "A100", 300)
    seconds, basis = d.predict(Job("next", estimated_runtime_s=1000), "A100")
    assert basis == "estimate"
    assert seconds == pytest.approx(500, rel=0.01)


def test_a_running_job_s_end_follows_its_progress_then_outliving_its_prediction() -> None:
    d = learned(100, 100, 100, 400, 400, job=Job("j"))
    assert d.total(Job("r"), "RTX 4090", elapsed=50, progress=0.25) == (200, "progress")
    total, _ = d.total(Job("r"), "RTX 4090", elapsed=300)
    assert total == 400, "past the typical run: the median of those that ran longer"
    total, _ = d.total(Job("r"), "RTX 4090", elapsed=1000)
    assert total == 1500, "longer than anything seen: half as long again"


def test_a_queued_job_starts_when_the_work_ahead_of_it_ends() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queued=(Job("next", resources=ONE, submitted_at=10, estimated_runtime_s=60),),
        allocations=(running("a1", "busy", "n1"),),
    )
    specs = {"busy": Job("busy", resources=ONE, estimated_runtime_s=600)}
    etas = estimate(snap, Config(), Durations(), 100.0, running=specs)
    assert (etas["busy"].start_at, etas["busy"].end_at) == (None, 600)
    assert (etas["next"].start_at, etas["next"].end_at, etas["next"].basis) == (
        600,
        660,
        "estimate",
    )


def test_a_job_placed_but_not_started_yet_is_expected_to_run_from_now() -> None:
    placed = Allocation(  # its agent has not said it started: no start time yet
        "a1", ("placed",), "n1", gpu_indices=(0,), gpu_milli=1000,
        observed=AllocObserved.PENDING,
    )  # fmt: skip
    snap = Snapshot(nodes=(node("n1"),), queued=(), allocations=(placed,))
    specs = {"placed": Job("placed", resources=ONE, estimated_runtime_s=600)}
    eta = estimate(snap, Config(), Durations(), 1_800_000_000.0, running=specs)["placed"]
    assert (eta.end_at, eta.runtime_s) == (1_800_000_600.0, 600)


def test_jobs_queue_in_the_scheduler_s_order_and_small_ones_fill_free_cards() -> None:
    jobs = (
        Job("batch", resources=ONE, priority="batch", estimated_runtime_s=100),
        Job("paid", resources=ONE, priority="paid", submitted_at=5, estimated_runtime_s=100),
        Job("big", resources=ResourceRequest(gpus=2), submitted_at=6, estimated_runtime_s=50),
    )
    snap = Snapshot(nodes=(node("n1"), node("n2")), queued=jobs)
    etas = estimate(snap, Config(), Durations(), 0.0)
    assert etas["paid"].start_at == 0, "the higher class first"
    assert etas["batch"].start_at == 0
    assert etas["big"].start_at is None, "no node has two cards"
    assert etas["big"].basis == "never"


def test_a_class_that_may_preempt_expects_to_start_once_its_victim_may_be_evicted() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queued=(Job("urgent", resources=ONE, priority="paid", estimated_runtime_s=60),),
        allocations=(running("a1", "slow", "n1", priority="batch"),),
    )
    specs = {"slow": Job("slow", resources=ONE, priority="batch", estimated_runtime_s=9000)}
    config = Config(min_runtime_before_preemption_s=60)
    etas = estimate(snap, config, Durations(), 10.0, running=specs)
    assert etas["urgent"].start_at == 60, "the batch job may be evicted after a minute"
    assert etas["slow"].end_at is not None
    assert etas["slow"].end_at > 9000, "preempted, it runs the rest of its work later"


def test_work_expected_from_the_last_hour_delays_a_lower_class() -> None:
    snap = Snapshot(
        nodes=(node("n1"),),
        queued=(Job("late", resources=ONE, priority="batch", estimated_runtime_s=100),),
        allocations=(running("a1", "busy", "n1", priority="paid"),),
    )
    specs = {"busy": Job("busy", resources=ONE, priority="paid", estimated_runtime_s=200)}
    recent = [
        Job("seen", resources=ONE, priority="paid", submitted_at=-3500, estimated_runtime_s=300)
    ]
    alone = estimate(snap, Config(), Durations(), 0.0, running=specs)
    expecting = estimate(snap, Config(), Durations(), 0.0, running=specs, recent=recent)
    assert alone["late"].start_at == 200
    # a paid job like the one an hour ago comes at 100, runs after "busy", from 200 to 500
    assert expecting["late"].start_at == 500
    assert "seen~eta" not in expecting, "an expected job gets no ETA of its own"


def test_the_replay_stops_at_its_bound() -> None:
    jobs = tuple(
        Job(f"j{k}", resources=ONE, submitted_at=k, estimated_runtime_s=10) for k in range(5)
    )
    etas = estimate(
        Snapshot(nodes=(node("n1"),), queued=jobs), Config(), Durations(), 0.0, cycles=2
    )
    assert [etas[f"j{k}"].start_at for k in range(5)] == [0, 10, None, None, None]
    assert etas["j4"].basis == "beyond"
