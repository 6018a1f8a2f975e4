"""The world's mechanics, driven by scripted policies so no scheduler logic is involved.

Preemption requeues a job that keeps the work it did; stale completion timers
are ignored; batches release their allocation with their last job; and plans
that would break the cluster's invariants are refused loudly.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.core import Job, ResourceRequest
from corral.core.clock import VirtualClock
from corral.scheduler import fragmentation as from_allocations
from corral.scheduler.api import Config, Placement, Plan, Preemption, Snapshot
from corral.scheduler.fragmentation import of_free
from corral.sim import generate, policies, runner
from corral.sim.baselines import first_fit
from corral.sim.errors import PlanRejected
from corral.sim.report import JobRecord, Metrics
from corral.sim.runner import ScheduleFn, simulate
from corral.sim.scenario import Scenario, SimJob, fixed_jobs
from corral.sim.world import World


def _job(job_id: str, at: float, duration: float | None, gpus: int = 4, **kw: object) -> SimJob:
    job = Job(job_id, resources=ResourceRequest(gpus=gpus), submitted_at=at, **kw)  # type: ignore[arg-type]
    return SimJob(job, duration)


def _run(
    policy: ScheduleFn, *jobs: SimJob, nodes: int = 1, gpus: int = 4, until: float | None = None
) -> tuple[dict[str, object], dict[str, JobRecord]]:
    records: dict[str, JobRecord] = {}
    scenario = Scenario(nodes=generate.cluster(nodes, gpus), jobs=fixed_jobs(jobs), until=until)
    summary = simulate(scenario, policy, sink=lambda r: records.__setitem__(r.id, r))
    return summary, records


def _preempting(at: float, victim: str) -> ScheduleFn:
    """First fit, except that at ``at`` it first evicts ``victim`` (once)."""

    def policy(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
        victims = [a for a in snapshot.allocations if victim in a.job_ids]
        if now == at and victims:
            return Plan(
                preemptions=tuple(
                    Preemption(a.id, a.job_ids, a.node, "high", "test") for a in victims
                )
            )
        return first_fit(snapshot, config, now, seed)

    return policy


def test_a_preempted_job_requeues_with_its_remaining_work_and_a_new_attempt() -> None:
    summary, jobs = _run(
        _preempting(200, "low"),
        _job("low", 0, 1000, priority="batch"),
        _job("high", 200, 100, priority="paid"),
    )
    low = jobs["low"]
    assert [(p.start, p.end, p.preempted) for p in low.placements] == [
        (0, 200, True),
        (300, 1100, False),  # the stale timer at 1000 did not end it
    ]
    assert (low.attempts, low.state.value, low.wait_s) == (2, "succeeded", 0)
    assert jobs["high"].placements[0].start == 200
    assert summary["preemptions"] == 1
    assert summary["end_s"] == 1100
    assert summary["gpu_allocation_ratio"] == 1.0  # the GPUs were never idle


def test_preempting_one_replica_of_a_gang_stops_the_whole_gang() -> None:
    summary, jobs = _run(
        _preempting(100, "gang"),
        _job("gang", 0, 500, gpus=4, replicas=2),
        _job("tick", 100, 1, gpus=0),  # an arrival, so a cycle runs at 100
        nodes=2,
    )
    gang = jobs["gang"]
    first = [p for p in gang.placements if p.start == 0]
    assert len(first) == 2
    assert all(p.preempted and p.end == 100 for p in first)
    assert summary["preemptions"] == 1
    assert gang.attempts == 2
    assert {p.end for p in gang.placements if p.start == 100} == {500}


def test_a_batch_allocation_ends_with_its_last_job() -> None:
    def batching(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
        if not snapshot.queued or snapshot.allocations:
            return Plan()
        ids = tuple(j.id for j in snapshot.queued)
        return Plan(
            placements=(Placement("batch", ids, "node-1", gpu_indices=(0,), gpu_milli=1000),)
        )

    summary, jobs = _run(batching, _job("a", 0, 10, gpus=1), _job("b", 0, 30, gpus=1), gpus=1)
    assert [p.end for p in jobs["a"].placements] == [30]  # the shared allocation's end
    assert [p.end for p in jobs["b"].placements] == [30]
    assert jobs["a"].state.value == jobs["b"].state.value == "succeeded"
    assert summary["gpu_allocation_ratio"] == 1.0
    assert summary["end_s"] == 30


def test_a_batch_keeps_its_expected_end_after_its_first_job_is_done() -> None:
    # The batch's end is its first job's estimate; that job is done at 10, its batch mate
    # runs to 30, and a snapshot at 15 still gives the allocation the batch's end.
    seen: dict[float, dict[str, float]] = {}

    def batching(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
        seen[now] = dict(snapshot.expected_ends)
        ids = tuple(j.id for j in snapshot.queued if j.resources.gpus)
        if not ids or snapshot.allocations:
            return Plan()
        return Plan(
            placements=(Placement("batch", ids, "node-1", gpu_indices=(0,), gpu_milli=1000),)
        )

    _run(
        batching,
        _job("a", 0, 10, gpus=1, estimated_runtime_s=40),
        _job("b", 0, 30, gpus=1, estimated_runtime_s=90),
        _job("tick", 15, 1, gpus=0),
        gpus=1,
    )
    assert seen[15] == {"batch": 40.0}


def _always(plan: Callable[[Snapshot], Plan]) -> ScheduleFn:
    def policy(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
        return plan(snapshot)

    return policy


def _place(alloc: str, job: str, gpus: tuple[int, ...], replica: int = 0) -> Placement:
    return Placement(alloc, (job,), "node-1", replica=replica, gpu_indices=gpus, gpu_milli=1000)


BAD_PLANS = [
    (
        "two-jobs-on-one-gpu",
        lambda s: Plan(placements=(_place("x", "a", (0,)), _place("y", "b", (0,)))),
        "over-committed",
    ),
    (
        "half-a-gang",
        lambda s: Plan(placements=(_place("x", "g", (0,)),)),
        "all or nothing",
    ),
    (
        "the-same-job-twice",
        lambda s: Plan(placements=(_place("x", "a", (0,)), _place("y", "a", (1,)))),
        "places 2 of the 1 replicas of job 'a'",
    ),
    (
        "a-placement-of-no-job",
        lambda s: Plan(placements=(Placement("x", (), "node-1", gpu_indices=(0,), gpu_milli=1),)),
        "places no job",
    ),
    (
        "a-job-that-is-not-queued",
        lambda s: Plan(placements=(_place("x", "ghost", (0,)),)),
        "not queued",
    ),
    (
        "a-gpu-the-node-lacks",
        lambda s: Plan(placements=(_place("x", "a", (9,)),)),
        "no GPU 9",
    ),
    (
        "an-allocation-id-twice",
        lambda s: Plan(placements=(_place("x", "a", (0,)), _place("x", "b", (1,)))),
        "allocation id already in use",
    ),
    (
        "gpus-without-a-share",
        lambda s: Plan(placements=(Placement("x", ("a",), "node-1", gpu_indices=(0,)),)),
        "gpu_milli 0",
    ),
]


@pytest.mark.parametrize(("plan", "want"), [pytest.param(p, w, id=i) for i, p, w in BAD_PLANS])
def test_plans_that_break_invariants_are_refused(
    plan: Callable[[Snapshot], Plan], want: str
) -> None:
    with pytest.raises(PlanRejected, match=want):
        _run(
            _always(plan),
            _job("a", 0, 10, gpus=1),
            _job("b", 0, 10, gpus=1),
            _job("g", 0, 10, gpus=1, replicas=2),
        )


def test_evicting_a_non_preemptible_allocation_is_refused() -> None:
    with pytest.raises(PlanRejected, match="not preemptible"):
        _run(
            _preempting(50, "pinned"),
            _job("pinned", 0, 100, preemptible=False),
            _job("tick", 50, 1, gpus=0),
        )


def test_a_scheduler_that_preempts_forever_is_stopped() -> None:
    def thrash(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
        """Evict whatever runs and put the first queued job on its GPUs, every cycle."""
        if snapshot.allocations and snapshot.queued:
            a, j = snapshot.allocations[0], snapshot.queued[0]
            swap = Placement(
                f"{j.id}:{j.attempt}",
                (j.id,),
                a.node,
                gpu_indices=a.gpu_indices,
                gpu_milli=1000,
                preempts=(a.id,),
            )
            return Plan(
                placements=(swap,),
                preemptions=(Preemption(a.id, a.job_ids, a.node, j.id, "thrash"),),
            )
        return first_fit(snapshot, config, now, seed)

    with pytest.raises(PlanRejected, match="did not settle"):
        _run(thrash, _job("a", 0, 100), _job("b", 5, 100))


def test_a_duplicate_id_while_the_first_job_is_in_flight_names_it() -> None:
    from corral.sim.errors import SimInputError

    with pytest.raises(SimInputError, match="still queued or running"):
        _run(first_fit, _job("a", 0, 100), _job("a", 5, 100))
    summary, _ = _run(first_fit, _job("a", 0, 10), _job("a", 50, 10))  # reuse after it ended
    assert summary["jobs_completed"] == 2


def test_a_job_of_an_unknown_team_is_refused_and_leaves_nothing_behind() -> None:
    from corral.core.model import Team
    from corral.sim.errors import SimInputError

    scenario = Scenario(
        nodes=generate.cluster(1, 4), jobs=fixed_jobs(()), teams=(Team("a"),), auto_teams=False
    )
    world = World(scenario, VirtualClock(), Metrics())
    with pytest.raises(SimInputError, match="unknown team 'b'"):
        world.submit(_job("x", 0, 10, team="b"))
    assert world.runs == {}
    assert world.queued == {}
    world.submit(_job("x", 0, 10, team="a"))  # the id is free: nothing was kept of it
    assert list(world.runs) == ["x"]
    assert list(world.queued) == ["x"]


def test_cycles_run_only_on_ticks_when_an_interval_is_set() -> None:
    records: dict[str, JobRecord] = {}
    scenario = Scenario(
        nodes=generate.cluster(1, 4),
        jobs=fixed_jobs((_job("a", 5, 100), _job("b", 130, 10))),
        cycle_interval_s=60,
    )
    summary = simulate(scenario, first_fit, sink=lambda r: records.__setitem__(r.id, r))
    assert records["a"].placements[0].start == 60  # arrived at 5, next tick 60
    assert records["b"].placements[0].start == 180  # a ends at 160; tick at 180
    assert summary["cycles"] == 2


def test_estimates_reach_the_scheduler_as_expected_ends_net_of_work_done() -> None:
    seen: list[dict[str, float]] = []

    def watching(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
        seen.append(dict(snapshot.expected_ends))
        return _preempting(100, "est")(snapshot, config, now, seed)

    est = Job("est", resources=ResourceRequest(gpus=4), submitted_at=0, estimated_runtime_s=500)
    _run(watching, SimJob(est, 400), _job("tick", 100, 1, gpus=0), _job("t2", 150, 1, gpus=0))
    assert {"est:1:0": 500.0} in seen  # started at 0 with a 500 s estimate
    assert {"est:2:0": 500.0} in seen  # restarted at 100 with 400 s of the estimate left


def test_progress_is_reported_and_ends_with_a_final_report() -> None:
    from corral.sim.runner import Progress

    reports: list[Progress] = []
    scenario = Scenario(nodes=generate.cluster(2, 4), jobs=fixed_jobs((_job("a", 0, 10),)))
    simulate(scenario, first_fit, progress=reports.append)
    assert reports[-1].done
    assert (reports[-1].arrived, reports[-1].now, reports[-1].queued) == (1, 10, 0)


def test_a_world_for_a_kept_scheduler_keeps_no_snapshot_maps_and_takes_no_snapshot() -> None:
    # ``corral`` (a kept scheduler, told each change and each expected end) never reads the
    # world's snapshot: the world keeps no map of queued jobs or expected ends for it (only
    # a count of queued jobs), and asking it for a snapshot says so instead of handing out
    # one without them.
    scenario = generate.scenario(2, 40, seed=1)
    kept = policies.drive("corral", scenario)
    assert kept.snapshots is False
    assert policies.drive("first-fit", scenario).snapshots is True
    world = World(scenario, VirtualClock(), Metrics(), observer=kept, snapshots=False)
    for sim_job in list(scenario.jobs())[:6]:
        world.submit(sim_job)
    assert world.waiting == 6
    started = world.apply(kept.plan(world.snapshot, scenario.config, 0.0, 0, {}), 0.0)
    assert world.allocations, "work started"
    assert world.waiting == 6 - len(started)
    assert world.queued is None
    with pytest.raises(RuntimeError, match="without snapshots"):
        world.snapshot()
    both = World(scenario, VirtualClock(), Metrics())
    for sim_job in list(scenario.jobs())[:6]:
        both.submit(sim_job)
    both.apply(first_fit(both.snapshot(), scenario.config, 0.0, 0), 0.0)
    assert both.snapshot().expected_ends, "a snapshot holds the ends of what runs"


def test_the_worlds_free_cards_measure_what_its_allocations_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The runner samples fragmentation from the world's free cards (``of_free``); at every
    # sample of a run with half-card jobs, gangs and preemptions, that must be what the
    # scheduler's measure makes of the world's allocations (a kept scheduler's world takes
    # no snapshot: the test makes its own). The golden reports check the sampled scores in
    # both builds.
    if runner.__file__ is None or not runner.__file__.endswith(".py"):
        pytest.skip("a compiled module's functions cannot be patched")
    checked: list[float] = []

    def measure(world: World) -> Callable[[], object]:
        def both() -> object:
            ours = of_free(world.nodes, world.gpu_free)
            held = Snapshot(nodes=world.nodes, allocations=tuple(world.allocations.values()))
            assert ours == from_allocations(held)
            checked.append(ours.score)
            return ours

        return both

    monkeypatch.setattr(runner, "_fragmentation_measure", measure)
    scenario = generate.scenario(6, 600, load=1.2, seed=4, cycle_interval_s=30.0)
    summary = simulate(scenario, "corral")
    assert summary["fragmentation"]["samples"] == len(checked) > 50
    assert len(set(checked)) > 5, "the cluster's spread changed along the run"
