"""The kept ``Scheduler`` decides exactly as ``schedule`` on its snapshot, cycle after cycle.

A random life of a cluster: jobs arrive (some with run-time estimates, some
batchable, some backing off), cycles run and their plans are applied (placed
jobs start, preempted ones queue again), work finishes, nodes pause. After
every change the kept scheduler's plan must equal the from-scratch plan on
``sched.snapshot()``, and the plan without explanations must have the same
placements and preemptions.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_replay import started
from scheduler_strategies import nodes, teams

from corral.core import (
    GIB,
    Allocation,
    Gpu,
    InvalidSpec,
    Job,
    JobKind,
    Node,
    ResourceRequest,
    Team,
)
from corral.scheduler import (
    Config,
    Plan,
    Scheduler,
    Snapshot,
    schedule,
)

CLASSES = ("interactive", "paid", "free", "batch")


@st.composite
def arrivals(draw: st.DrawFn, start: int) -> list[Job]:
    """A few jobs of every shape: whole GPUs (some gangs), shares, CPU, sample batches."""
    out = []
    for i in range(draw(st.integers(1, 8))):
        shape = draw(st.sampled_from(("whole", "whole", "big", "share", "cpu", "sample")))
        kind, batch, model = JobKind.TRAIN, None, None
        if shape == "whole":
            res = ResourceRequest(gpus=draw(st.integers(1, 2)), cpus=1)
        elif shape == "big":
            res = ResourceRequest(gpus=draw(st.sampled_from((2, 4))), cpus=1)
        elif shape == "share":
            res = ResourceRequest(gpu_milli=500, cpus=1, cpu_fallback=draw(st.booleans()))
        elif shape == "cpu":
            res = ResourceRequest(cpus=2)
        else:
            kind, batch, model = JobKind.SAMPLE, "k", "sdxl"
            res = ResourceRequest(vram_bytes=8 * GIB, cpus=1)
        out.append(
            Job(
                id=f"j{start + i}",
                resources=res,
                kind=kind,
                batch_key=batch,
                model=model,
                priority=draw(st.sampled_from(CLASSES)),
                team=draw(st.sampled_from(("a", "b", "default", "default"))),
                user=draw(st.sampled_from(("u1", "u2", "u3"))),
                replicas=draw(st.sampled_from((1, 1, 1, 2))) if shape != "sample" else 1,
                preemptible=draw(st.integers(0, 4)) > 0,
                submitted_at=float(start + i),
                not_before=float(draw(st.sampled_from((0, 0, 0, 150)))),
                estimated_runtime_s=draw(st.sampled_from((None, 30.0, 200.0, 5000.0))),
            )
        )
    return out


op = st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 10**6)),
    st.tuples(st.just("arrive"), st.integers(0, 10**6)),
    st.tuples(st.just("cycle"), st.integers(0, 90)),
    st.tuples(st.just("cycle"), st.integers(0, 90)),
    st.tuples(st.just("finish"), st.integers(0, 20)),
    st.tuples(st.just("pause"), st.integers(0, 5)),
    st.tuples(st.just("flood"), st.integers(1, 12)),
)


@st.composite
def busy(draw: st.DrawFn) -> tuple[tuple[Node, ...], tuple[Team, ...]]:
    """Varied small clusters, or a few alike 4-GPU nodes shared by teams with quotas."""
    if draw(st.booleans()):
        return draw(nodes()), draw(teams())
    count = draw(st.integers(1, 4))
    cluster = tuple(
        Node(f"n{i}", gpus=tuple(Gpu(g, "A100", 80 * GIB) for g in range(4)), cpus=16)
        for i in range(count)
    )
    quota = draw(st.integers(0, 4 * count))
    squad = (Team("a", quota, draw(st.sampled_from((None, 2)))), Team("b", 4 * count - quota))
    return cluster, squad


configs = st.builds(
    Config,
    reserve_min_gpus=st.sampled_from((None, 2, 4)),
    preemption=st.booleans(),
    min_runtime_before_preemption_s=st.sampled_from((0.0, 60.0)),
    max_placements_per_cycle=st.sampled_from((None, None, 2)),
    max_batch_size=st.integers(1, 3),
)


class Life:
    """A kept scheduler, and the jobs it was given (for requeueing)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.jobs: dict[str, Job] = {}
        self.now = 0.0
        self.next_id = 0

    def arrive(self, jobs: list[Job]) -> None:
        for job in jobs:
            job = replace(job, id=f"j{self.next_id}", submitted_at=self.now)
            self.next_id += 1
            self.jobs[job.id] = job
            self.sched.submit(job)

    def apply(self, plan: Plan) -> None:
        sched = self.sched
        requeue: set[str] = set()
        for stop in plan.preemptions:
            if stop.allocation_id in sched.allocations:
                requeue.update(sched.end(stop.allocation_id).job_ids)
        placed: set[str] = set()
        for p in plan.placements:
            lead = self.jobs[p.job_ids[0]]
            for job_id in p.job_ids:
                if job_id not in placed:
                    sched.withdraw(job_id)
                    placed.add(job_id)
            estimate = lead.estimated_runtime_s
            end = None if estimate is None else self.now + estimate
            sched.start(started(p, lead, self.now), end)
        for job_id in sorted(requeue - placed):
            job = replace(self.jobs[job_id], attempt=self.jobs[job_id].attempt + 1)
            self.jobs[job_id] = job
            for alloc in [a for a in sched.allocations.values() if job_id in a.job_ids]:
                sched.end(alloc.id)
            sched.submit(job)

    def flood(self, count: int) -> None:
        """Borrowers: the default team (no quota) asks for a lot of single GPUs."""
        one = ResourceRequest(gpus=1, cpus=1)
        self.arrive([Job("x", one, team="default", user="u9", priority="batch")] * count)

    def finish(self, k: int) -> None:
        running = list(self.sched.allocations.values())
        if running:
            done = running[k % len(running)].job_ids
            for alloc in [a for a in running if set(a.job_ids) & set(done)]:
                self.sched.end(alloc.id)

    def pause(self, k: int) -> None:
        nodes = list(self.sched.nodes)
        if nodes:
            i = k % len(nodes)
            nodes[i] = replace(nodes[i], paused=not nodes[i].paused)
            self.sched.set_nodes(tuple(nodes))

    def step(self, kind: str, arg: int, data: st.DataObject) -> bool:
        """Do one non-clock op of a drawn sequence; False for a tick (the caller's to do)."""
        if kind == "arrive":
            self.arrive(data.draw(arrivals(arg)))
        elif kind == "finish":
            self.finish(arg)
        elif kind == "pause":
            self.pause(arg)
        elif kind == "flood":
            self.flood(arg)
        else:
            return False
        return True


@settings(max_examples=150, deadline=None)
@given(busy(), configs, st.lists(op, min_size=1, max_size=30), st.data())
def test_the_kept_scheduler_plans_exactly_as_schedule_on_its_snapshot(
    world: tuple[tuple[Node, ...], tuple[Team, ...]],
    config: Config,
    ops: list[tuple[str, int]],
    data: st.DataObject,
) -> None:
    life = Life(Scheduler(*world, config))
    life.flood(data.draw(st.integers(0, 16)))  # borrowers first: reclaim country
    for kind, arg in ops:
        if not life.step(kind, arg, data):
            life.now += arg
            kept = life.sched.schedule(life.now)
            fresh = schedule(life.sched.snapshot(), config, life.now)
            assert kept == fresh
            quick = life.sched.schedule(life.now, explain=False)
            assert quick.placements == fresh.placements
            assert quick.preemptions == fresh.preemptions
            assert all(r.code.value == "cycle_limit" for u in quick.unplaced for r in u.reasons)
            life.apply(fresh)


def test_a_cycle_leaves_the_kept_state_as_it_was() -> None:
    cluster = tuple(Node(f"n{i}", gpus=(Gpu(0, "A100", 80 * GIB),), cpus=4) for i in range(2))
    sched = Scheduler(cluster)
    sched.submit(Job("a", ResourceRequest(gpus=1)))
    sched.submit(Job("b", ResourceRequest(gpus=1)))
    before = sched.snapshot()
    first = sched.schedule(10.0)
    assert len(first.placements) == 2
    assert sched.snapshot() == before
    assert sched.schedule(10.0) == first  # nothing of the first cycle stayed behind


def test_an_empty_snapshot_and_bad_input_behave_like_schedule() -> None:
    assert Scheduler().schedule(0.0) == Plan()
    assert Snapshot() == Scheduler().snapshot()
    sched = Scheduler()
    sched.submit(Job("a"))
    with pytest.raises(InvalidSpec, match="duplicate 'a'") as caught:
        sched.submit(Job("a"))
    assert caught.value.field == "snapshot.queued"  # the error schedule() gives


def test_the_running_work_that_breaks_ties_follows_allocations_starting_and_ending() -> None:
    # One card free of four; u runs two allocations and v one, each queues a job: v's goes
    # (less running work). Then u's two end and w's two-card one starts (one card free
    # again): u now runs nothing, so u's goes. The kept counts move with each start and end.
    sched = Scheduler((Node("n", gpus=tuple(Gpu(i, "A100", 80 * GIB) for i in range(4)), cpus=8),))

    def running(alloc_id: str, user: str, *cards: int) -> Allocation:
        return Allocation(alloc_id, (alloc_id,), "n", user=user, gpu_indices=cards, gpu_milli=1000)

    for alloc in (running("a1", "u", 0), running("a2", "u", 1), running("a3", "v", 2)):
        sched.start(alloc)
    sched.submit(Job("u1", ResourceRequest(gpus=1), user="u", submitted_at=0.0))
    sched.submit(Job("v1", ResourceRequest(gpus=1), user="v", submitted_at=1.0))
    assert [p.job_ids for p in sched.schedule(5.0).placements] == [("v1",)]
    sched.end("a1")
    sched.end("a2")
    sched.start(running("a4", "w", 0, 1))
    assert [p.job_ids for p in sched.schedule(6.0).placements] == [("u1",)]
