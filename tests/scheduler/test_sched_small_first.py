"""Small jobs first: inside a class, jobs smaller than ``reserve_min_gpus`` go before big
ones, except big jobs that have waited ``big_wait_ratio`` (4 here) times as long as the
oldest small job waiting (those go first, and reserve the nodes that free up first for them).

The cluster of most cases: one node of 4 cards, 3 of them busy until t=500. A 4-GPU job
(big, with ``reserve_min_gpus=4``) fits there at 500; a 1-GPU job fits now.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_builders import JobBuilder, alloc, job, node, snapshot

from corral.core import Allocation, AllocObserved, Job
from corral.core.errors import InvalidSpec
from corral.scheduler import Config, Plan, ReasonCode, Scheduler, Snapshot, schedule

SMALL_FIRST = Config(reserve_min_gpus=4, big_wait_ratio=4.0)
HEAD = Config(reserve_min_gpus=4, big_wait_ratio=None)  # the oldest big job first, always


def one_node(*queued: JobBuilder) -> Snapshot:
    snap = snapshot([node("n1").gpus(4)], list(queued), [alloc("busy", "n1").cards(0, 1, 2)])
    return replace(snap, expected_ends={"busy": 500.0})


def big(job_id: str, at: float) -> JobBuilder:
    return job(job_id).gpus(4).set(priority="batch", submitted_at=at)


def small(job_id: str, at: float, estimate: float | None = 2000.0) -> JobBuilder:
    return job(job_id).gpus(1).set(priority="batch", submitted_at=at, estimated_runtime_s=estimate)


def where(plan: Plan) -> dict[str, str]:
    return {j: p.node for p in plan.placements for j in p.job_ids}


def cluster(*queued: JobBuilder) -> Snapshot:
    """n1 and n2: 3 of 4 cards busy until 500 and 800; n3: 4 free cards."""
    nodes = [node("n1").gpus(4), node("n2").gpus(4), node("n3").gpus(4)]
    busy = [alloc("busy1", "n1").cards(0, 1, 2), alloc("busy2", "n2").cards(0, 1, 2)]
    snap = snapshot(nodes, list(queued), busy)
    return replace(snap, expected_ends={"busy1": 500.0, "busy2": 800.0})


def test_the_oldest_big_job_still_goes_first_and_holds_its_reservation() -> None:
    # EASY backfill's guarantee: the head of the line is decided first whatever it waited
    snap = one_node(small("s", at=0), big("big", at=90))
    plan = schedule(snap, SMALL_FIRST, now=100.0)
    assert where(plan) == {}  # the small job would end after 500: it would delay the big one
    reasons = {u.job_id: u.reasons for u in plan.unplaced}
    held = [r for r in reasons["big"] if r.code is ReasonCode.HOLDS_RESERVATION]
    assert held
    assert "n1" in held[0].message


def test_a_big_job_that_is_not_due_takes_what_small_jobs_leave() -> None:
    # b2 has waited 50 s, the small jobs 20 s: 50 < 4 x 20, so the small jobs go first:
    # n2's free card, then n3. The head of the line, b1 (H100 only), holds n1.
    nodes = [node("n1").gpus(4, "H100"), node("n2").gpus(4), node("n3").gpus(4)]
    busy = [alloc("busy1", "n1").cards(0, 1, 2), alloc("busy2", "n2").cards(0, 1, 2)]
    b1 = big("b1", at=0).gpu_models("H100")
    smalls = [small(f"s{i}", at=80).gpu_models("A100") for i in range(4)]
    snap = snapshot(nodes, [b1, big("b2", at=50), *smalls], busy)
    snap = replace(snap, expected_ends={"busy1": 500.0, "busy2": 800.0})
    assert where(schedule(snap, SMALL_FIRST, now=100.0)) == {
        "s0": "n2",
        "s1": "n3",
        "s2": "n3",
        "s3": "n3",
    }
    # one fair order instead: b2 is older than the small jobs and takes n3
    assert where(schedule(snap, HEAD, now=100.0)) == {"b2": "n3", "s0": "n2"}


def test_a_due_big_job_reserves_before_small_jobs() -> None:
    # b2 has waited 90 s, the small job 10 s: 90 >= 4 x 10, so b2 is due and holds n2 (the
    # node that frees next); the small job, ending after 800, fits on neither held node
    snap = cluster(big("b1", at=0), big("b2", at=10), small("s", at=90))
    plan = schedule(replace(snap, nodes=snap.nodes[:2]), SMALL_FIRST, now=100.0)
    assert where(plan) == {}
    reasons = {u.job_id: u.reasons for u in plan.unplaced}
    held = [r for r in reasons["b2"] if r.code is ReasonCode.HOLDS_RESERVATION]
    assert held
    assert "n2" in held[0].message
    # not yet due (waited 30 s < 4 x 10): the small job takes n2's free card
    snap = cluster(big("b1", at=0), big("b2", at=70), small("s", at=90))
    plan = schedule(replace(snap, nodes=snap.nodes[:2]), SMALL_FIRST, now=100.0)
    assert where(plan) == {"s": "n2"}


def test_a_small_job_that_ends_before_a_due_reservation_still_backfills() -> None:
    snap = one_node(big("big", at=0), small("quick", at=80, estimate=300.0))
    assert where(schedule(snap, SMALL_FIRST, now=100.0)) == {"quick": "n1"}


def test_with_no_small_job_waiting_big_jobs_go_first_as_before() -> None:
    snap = one_node(big("big", at=90))
    plan = schedule(snap, SMALL_FIRST, now=100.0)
    reasons = {u.job_id: u.reasons for u in plan.unplaced}
    assert any(r.code is ReasonCode.HOLDS_RESERVATION for r in reasons["big"])


def test_the_ratio_is_checked() -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidSpec, match=r"config\.big_wait_ratio"):
            Config(big_wait_ratio=bad)


@settings(max_examples=80, deadline=None)
@given(
    busy=st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=3),
    ends=st.lists(st.integers(101, 2000), min_size=12, max_size=12),
    smalls=st.lists(
        st.tuples(st.integers(1, 3), st.integers(0, 90), st.one_of(st.none(), st.integers(1, 900))),
        max_size=8,
    ),
    bigs=st.lists(st.integers(1, 2), min_size=1, max_size=3),
)
def test_small_jobs_are_placed_as_if_big_jobs_that_are_not_due_were_not_there(
    busy: list[list[bool]],
    ends: list[int],
    smalls: list[tuple[int, int, int | None]],
    bigs: list[int],
) -> None:
    # Every small job has waited at least 10 s and the big jobs (4 GPUs a replica) none:
    # no big job but the head of the line (b0) is due, so the small jobs' placements are
    # those of a queue holding b0 alone.
    nodes = [node(f"n{i}").gpus(4) for i in range(len(busy))]
    allocs = []
    for i, cards in enumerate(busy):
        used = tuple(c for c, b in enumerate(cards) if b)
        if used:
            allocs.append(alloc(f"a{i}", f"n{i}").cards(*used))
    expected = {f"a{i}": float(ends[i]) for i in range(len(busy))}
    little = [
        job(f"s{k}").gpus(g).set(priority="batch", submitted_at=at, estimated_runtime_s=est)
        for k, (g, at, est) in enumerate(smalls)
    ]
    large = [
        job(f"b{k}").gpus(4).set(priority="batch", submitted_at=100.0, replicas=r)
        for k, r in enumerate(bigs)
    ]
    with_big = replace(snapshot(nodes, little + large, allocs), expected_ends=expected)
    without = replace(snapshot(nodes, little + large[:1], allocs), expected_ends=expected)
    small_ids = {f"s{k}" for k in range(len(smalls))}
    plan = schedule(with_big, SMALL_FIRST, now=100.0)
    alone = schedule(without, SMALL_FIRST, now=100.0)
    got = {j: p.node for p in plan.placements for j in p.job_ids if j in small_ids}
    assert got == {j: n for j, n in where(alone).items() if j in small_ids}


def test_a_big_job_starts_within_its_bound_while_small_jobs_keep_coming() -> None:
    # One node of 4 cards; a 1-GPU job of 100 s arrives every 30 s for ever, so the node
    # always holds small work. The big job (all 4 cards) comes due once it has waited 4 x
    # the oldest small job's wait, then holds the node until it drains.
    def run(config: Config) -> dict[str, float]:
        sched = Scheduler([node("n1").gpus(4).build()], (), config)
        started: dict[str, float] = {}
        running: dict[str, float] = {}  # allocation id -> end
        jobs: dict[str, Job] = {}
        for tick in range(0, 200):
            now = tick * 10.0
            for alloc_id, end in list(running.items()):
                if end <= now:
                    sched.end(alloc_id)
                    del running[alloc_id]
            arrivals = [small(f"s{tick}", at=now, estimate=120.0).build()] if tick % 3 == 0 else []
            if tick == 1:
                arrivals.append(big("big", at=now).build())
            for j in arrivals:
                jobs[j.id] = j
                sched.submit(j)
            plan = sched.schedule(now, explain=False)
            for p in plan.placements:
                lead = jobs[p.job_ids[0]]
                sched.withdraw(lead.id)
                started.setdefault(lead.id, now)
                run_s = 600.0 if lead.id == "big" else 100.0
                sched.start(_allocation(p.allocation_id, lead, p, now), now + run_s)
                running[p.allocation_id] = now + run_s
        return {j: started[j] - jobs[j].submitted_at for j in started}

    waits = run(SMALL_FIRST)
    assert "big" in waits
    smalls = [w for j, w in waits.items() if j != "big"]
    # due after 4 x a small job's wait (at most a cycle or two), then the node drains
    # (each small job runs 100 s): well inside 400 s
    assert waits["big"] <= 400.0
    assert max(smalls) <= 700.0  # the small jobs behind the big one wait for its 600 s


def _allocation(alloc_id: str, lead: Job, p: object, now: float) -> Allocation:
    return Allocation(
        id=alloc_id,
        job_ids=p.job_ids,  # type: ignore[attr-defined]
        node=p.node,  # type: ignore[attr-defined]
        team=lead.team,
        user=lead.user,
        priority=lead.priority,
        gpu_indices=p.gpu_indices,  # type: ignore[attr-defined]
        gpu_milli=p.gpu_milli,  # type: ignore[attr-defined]
        cpus=p.cpus,  # type: ignore[attr-defined]
        started_at=now,
        observed=AllocObserved.RUNNING,
    )
