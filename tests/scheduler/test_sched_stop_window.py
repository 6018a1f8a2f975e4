"""Evictions while earlier victims stop: none bought twice, none costlier than waiting.

Issue 48's reclaim (team a holds 30 GPUs of its quota of 20 as ten 3-GPU jobs on four
10-GPU nodes; team b is owed 20) as a real server meets it: victims take a moment to stop,
and work started in one cycle passes its minimum run time milliseconds apart.
"""

from __future__ import annotations

from dataclasses import replace

from scheduler_builders import AllocBuilder, alloc, job, node, team

from corral.core.model import Allocation, Job
from corral.core.states import AllocDesired
from corral.scheduler import Config, Plan, Remedy, Snapshot, schedule
from corral.scheduler.stopping import stop_window

NODES = tuple(node(f"n{i}").gpus(10).build() for i in range(4))
TEAMS = (team("a", 20), team("b", 20))
CONFIG = Config(min_runtime_before_preemption_s=60)


def _lenders(started: dict[str, float] | None = None) -> list[Allocation]:
    """a's ten 3-GPU jobs, three per node and the tenth on n3; b0 (4 GPUs) next to it."""
    allocs: list[AllocBuilder] = []
    for k in range(10):
        where, first = f"n{k // 3}", 3 * (k % 3)
        at = (started or {}).get(where, 0.0)
        allocs.append(
            alloc(f"a{k}", where)
            .cards(first, first + 1, first + 2)
            .set(team="a", started_at=at, borrowed=k >= 6)
        )
    allocs.append(alloc("b0", "n3").cards(3, 4, 5, 6).set(team="b", started_at=20.0))
    return [a.build() for a in allocs]


def _jobs(*ids: str) -> tuple[Job, ...]:
    return tuple(job(i).gpus(4).set(team="b", submitted_at=20.0).build() for i in ids)


def _plan(allocs: list[Allocation], jobs: tuple[Job, ...], now: float) -> Plan:
    return schedule(Snapshot(NODES, jobs, tuple(allocs), TEAMS), CONFIG, now=now)


def _stopping(allocs: list[Allocation], plan: Plan, now: float) -> list[Allocation]:
    """What the server's scheduler holds once ``plan``'s preemptions are asked for: the
    victims replaced by their stop window (claims, leftovers)."""
    by_id = {a.id: a for a in allocs}
    evicted = {p.allocation_id for p in plan.preemptions}
    held = [a for a in allocs if a.id not in evicted]
    for p in plan.placements:
        victims = {v: by_id[v] for v in p.preempts}
        waiting = job(p.job_ids[0]).gpus(4).set(team="b").build()
        claims, leftovers = stop_window(waiting, [p], victims, now)
        held += claims + list(leftovers.values())
    return held


def _as_told(allocs: list[Allocation], plan: Plan) -> list[Allocation]:
    """The same moment told naively: the victims still active, flagged to stop, and
    nothing of the jobs waiting for them."""
    evicted = {p.allocation_id for p in plan.preemptions}
    return [replace(a, desired=AllocDesired.PREEMPT) if a.id in evicted else a for a in allocs]


def test_a_cycle_while_victims_stop_evicts_nothing_more_for_room_already_bought() -> None:
    allocs = _lenders()
    first = _plan(allocs, _jobs("b1", "b2", "b3", "b4"), now=61.0)
    assert len(first.preemptions) == 4  # a: 30 -> 18; b: 4 -> 20
    # b asks for one more while a's victims stop: b is at its quota once they have, and a
    # under its own: nobody owes anybody an eviction
    late = _jobs("b5")
    during = _plan(_stopping(allocs, first, 61.5), late, now=61.5)
    assert during.preemptions == ()
    assert during.unplaced[0].remedy is not Remedy.PREEMPT
    # told naively, a still counts its victims (30, over its quota) and b not its waiting
    # jobs (4): the cycle would evict a fifth job of a's
    naive = _plan(_as_told(allocs, first), late, now=61.5)
    assert len(naive.preemptions) == 1


def test_the_free_cards_a_waiting_job_was_given_are_not_given_again() -> None:
    allocs = _lenders()
    first = _plan(allocs, _jobs("b1"), now=61.0)
    assert len(first.preemptions) == 1
    (claimed,) = first.placements
    held = _stopping(allocs, first, 61.5)
    during = _plan(held, _jobs("b2", "b3", "b4"), now=61.5)
    assert len(during.preemptions) == 3  # one each: the fewest, and none twice
    for p in during.placements:
        if p.node == claimed.node:  # a node's cards go to one job each
            assert not set(p.gpu_indices) & set(claimed.gpu_indices)
    naive = _plan(_as_told(allocs, first), _jobs("b2", "b3", "b4"), now=61.5)
    reused = [
        p
        for p in naive.placements
        if p.node == claimed.node and set(p.gpu_indices) & set(claimed.gpu_indices)
    ]
    assert reused  # told naively, the free card next to b1's victim looks free


def test_a_job_waits_a_moment_rather_than_evict_two_where_one_will_do() -> None:
    # n0's work started at 0; the others' a moment later: at 60.0 only n0's may go
    allocs = _lenders({"n1": 0.01, "n2": 0.01, "n3": 0.01})
    jobs = _jobs("b1", "b2", "b3", "b4")
    now = _plan(allocs, jobs, now=60.005)
    assert len(now.preemptions) == 1  # n0: one eviction next to a free card serves b1
    assert len(now.unplaced) == 3
    for u in now.unplaced:  # two evictions on n0 would serve one more; one elsewhere soon
        assert u.remedy is Remedy.PREEMPT
        assert "minimum run time" in u.summary()
    later = _plan(_stopping(allocs, now, 60.02), jobs[1:], now=60.02)
    assert len(later.preemptions) == 3  # one each on n1, n2, n3: four in all, as at once
    assert {p.node for p in later.preemptions} == {"n1", "n2", "n3"}
    at_once = _plan(_lenders(), jobs, now=60.02)
    assert len(at_once.preemptions) == 4
