"""Preemption: who may evict whom, how few, and never in vain."""

from __future__ import annotations

import pytest
from scheduler_builders import AllocBuilder, alloc, job, node, snapshot, team

from corral.core.model import PriorityClass
from corral.scheduler import Config, Remedy, schedule

NOW = 10_000.0


def busy(node_name: str, cards: int, **fields: object) -> list[AllocBuilder]:
    """One allocation per card of ``node_name``."""
    return [
        alloc(f"{node_name}-{c}", node_name).cards(c).set(started_at=0.0, **fields)
        for c in range(cards)
    ]


def test_a_class_that_can_preempt_evicts_a_lower_class_of_its_own_team() -> None:
    allocs = busy("n", 2, team="t", priority="free")
    plan = schedule(
        snapshot([node("n").gpus(2)], [job("p").gpus(1).set(team="t", priority="paid")], allocs),
        now=NOW,
    )
    assert [p.job_ids for p in plan.placements] == [("p",)]
    assert len(plan.preemptions) == 1
    assert plan.placements[0].preempts == (plan.preemptions[0].allocation_id,)
    assert plan.preemptions[0].for_job == "p"


def test_priority_preemption_stays_inside_the_team() -> None:
    allocs = busy("n", 2, team="other", priority="free")
    plan = schedule(
        snapshot([node("n").gpus(2)], [job("p").gpus(1).set(team="t", priority="paid")], allocs),
        now=NOW,
    )
    assert not plan.placements
    assert not plan.preemptions


def test_non_preemptible_work_is_never_evicted() -> None:
    allocs = busy("n", 1, team="t", priority="free", preemptible=False)
    allocs += busy("m", 1, team="t", priority="interactive")  # a non-preemptible class
    jobs = [job("p").gpus(1).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("n").gpus(1), node("m").gpus(1)], jobs, allocs), now=NOW)
    assert not plan.preemptions
    assert plan.unplaced[0].remedy is Remedy.WAIT


def test_reclaim_never_evicts_a_higher_class_for_a_lower_one() -> None:
    allocs = busy("n", 4, team="a", priority="paid", borrowed=True)
    jobs = [job("b1").gpus(1).set(team="b", priority="free")]
    teams = [team("a", 0), team("b", 4)]
    plan = schedule(snapshot([node("n").gpus(4)], jobs, allocs, teams), now=NOW)
    assert not plan.preemptions


def test_young_work_is_protected_by_the_minimum_run_time() -> None:
    allocs = busy("n", 2, team="t", priority="free")
    jobs = [job("p").gpus(1).set(team="t", priority="paid")]
    config = Config(min_runtime_before_preemption_s=600)
    plan = schedule(snapshot([node("n").gpus(2)], jobs, allocs), config, now=300.0)
    assert not plan.preemptions
    assert plan.unplaced[0].remedy is Remedy.PREEMPT  # it would help once they are older
    plan = schedule(snapshot([node("n").gpus(2)], jobs, allocs), config, now=601.0)
    assert len(plan.preemptions) == 1


def test_the_victim_that_loses_least_work_goes_first() -> None:
    allocs = [
        alloc("old-ckpt", "n").cards(0).set(team="t", started_at=0.0, last_checkpoint_at=100.0),
        alloc("fresh-ckpt", "n").cards(1).set(team="t", started_at=0.0, last_checkpoint_at=9_990.0),
        alloc("never", "n").cards(2).set(team="t", started_at=0.0),
    ]
    jobs = [job("p").gpus(1).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("n").gpus(3)], jobs, allocs), now=NOW)
    assert [p.allocation_id for p in plan.preemptions] == ["fresh-ckpt"]


def test_fewest_victims_win_over_cheaper_but_more_numerous_ones() -> None:
    allocs = [
        alloc("small1", "a").cards(0).set(team="t", started_at=0.0, last_checkpoint_at=9_999.0),
        alloc("small2", "a").cards(1).set(team="t", started_at=0.0, last_checkpoint_at=9_999.0),
        alloc("big", "b").cards(0, 1).set(team="t", started_at=0.0),
    ]
    jobs = [job("p").gpus(2).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("a").gpus(2), node("b").gpus(2)], jobs, allocs), now=NOW)
    assert [p.allocation_id for p in plan.preemptions] == ["big"]


def test_no_preemption_when_the_job_still_would_not_fit() -> None:
    allocs = busy("n", 2, team="t", priority="free")
    allocs += [alloc("vip", "n").cards(2, 3).set(team="t", priority="interactive")]
    jobs = [job("p").gpus(4).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("n").gpus(4)], jobs, allocs), now=NOW)
    assert not plan.preemptions
    assert not plan.placements


def test_evicting_one_replica_of_a_gang_evicts_the_whole_gang() -> None:
    allocs = [
        alloc(f"g/r{i}", f"n{i}").cards(0).set(job_ids=("g",), replica=i, team="t", started_at=0.0)
        for i in range(2)
    ]
    jobs = [job("p").gpus(1).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("n0").gpus(1), node("n1").gpus(1)], jobs, allocs), now=NOW)
    assert sorted(p.allocation_id for p in plan.preemptions) == ["g/r0", "g/r1"]


def test_preemption_can_be_switched_off() -> None:
    allocs = busy("n", 1, team="t", priority="free")
    jobs = [job("p").gpus(1).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("n").gpus(1)], jobs, allocs), Config(preemption=False), now=NOW)
    assert not plan.preemptions
    assert not plan.placements


def test_a_gang_owed_its_quota_reclaims_room_for_every_replica_or_for_none() -> None:
    nodes = [node("n0").gpus(4), node("n1").gpus(4)]
    allocs = busy("n0", 4, team="a", borrowed=True) + busy("n1", 4, team="a", borrowed=True)
    teams = [team("a", 0), team("b", 8)]
    gang = job("g").gpus(4).set(team="b", replicas=2)
    plan = schedule(snapshot(nodes, [gang], allocs, teams), now=NOW)
    assert len(plan.placements) == 2
    assert len(plan.preemptions) == 8
    assert {p.node for p in plan.placements} == {"n0", "n1"}
    assert all(len(p.preempts) == 4 for p in plan.placements)

    too_big = job("g").gpus(4).set(team="b", replicas=3)
    plan = schedule(snapshot(nodes, [too_big], allocs, [team("a", 0), team("b", 12)]), now=NOW)
    assert not plan.preemptions
    assert not plan.placements


SURGE_CLASSES = (
    PriorityClass("surge", rank=50, preempt_other_teams=True),
    PriorityClass("free", rank=20),
    PriorityClass("batch", rank=10),
)


@pytest.mark.parametrize(
    ("victim_class", "victim_quota", "want_evicted"),
    [
        pytest.param("batch", 0, 1, id="another team's borrowed lower class"),
        pytest.param("batch", 2, 0, id="never below that team's quota"),
        pytest.param("surge", 0, 0, id="never its own rank"),
    ],
)
def test_a_class_may_preempt_other_teams_only_beyond_their_quota(
    victim_class: str, victim_quota: int, want_evicted: int
) -> None:
    allocs = busy("n", 2, team="a", priority=victim_class)
    jobs = [job("s").gpus(1).set(team="b", priority="surge")]
    teams = [team("a", victim_quota), team("b", 0)]
    config = Config(priority_classes=SURGE_CLASSES)
    plan = schedule(snapshot([node("n").gpus(2)], jobs, allocs, teams), config, now=NOW)
    assert len(plan.preemptions) == want_evicted
    assert len(plan.placements) == want_evicted
