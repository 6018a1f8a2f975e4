"""Preemption: who may evict whom, how few, and never in vain."""

from __future__ import annotations

import pytest
from scheduler_builders import AllocBuilder, NodeBuilder, alloc, job, node, snapshot, team

from corral.core.model import PriorityClass
from corral.scheduler import Config, Plan, Remedy, schedule

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


# Issue 48's reclaim: 4 nodes x 10 GPUs; team a (quota 20) runs ten 3-GPU jobs from t=0, team
# b (quota 20) submits five 4-GPU jobs at t=20. The minimum run time is the default 60 s.


def _lenders() -> tuple[list[AllocBuilder], list[NodeBuilder]]:
    """Team a's ten 3-GPU jobs as best fit packs them: three per node, the tenth on n3,
    the last four placed beyond a's quota (borrowed)."""
    allocs, nodes = [], [node(f"n{i}").gpus(10) for i in range(4)]
    for k in range(10):
        where, first = f"n{k // 3}", 3 * (k % 3)
        allocs.append(
            alloc(f"a{k}", where)
            .cards(first, first + 1, first + 2)
            .set(team="a", started_at=0.0, borrowed=k >= 6)
        )
    return allocs, nodes


def _issue_48(now: float, b_running: int = 0) -> tuple[Plan, list[AllocBuilder]]:
    allocs, nodes = _lenders()
    for k in range(b_running):
        allocs.append(alloc(f"b{k}", "n3").cards(3, 4, 5, 6).set(team="b", started_at=20.0))
    jobs = [job(f"b{k}").gpus(4).set(team="b", submitted_at=20.0) for k in range(b_running, 5)]
    teams = [team("a", 20), team("b", 20)]
    return schedule(snapshot(nodes, jobs, allocs, teams), now=now), allocs


def test_the_queue_says_when_a_reclaim_becomes_possible() -> None:
    plan, _ = _issue_48(now=22.0, b_running=1)
    assert not plan.preemptions
    for u in plan.unplaced:
        assert u.remedy is Remedy.PREEMPT
        assert "team a's work passes its 60 s minimum run time in ~38 s" in u.summary()


def test_a_reclaim_evicts_exactly_what_the_owed_team_needs() -> None:
    plan, allocs = _issue_48(now=61.0, b_running=1)
    # a holds 30 of its 20; b needs 16 more: four 3-GPU evictions are the fewest that fit
    # four 4-GPU jobs, and a ends at 18 (one more eviction would leave b nothing to gain)
    assert sorted(p.job_ids[0] for p in plan.placements) == ["b1", "b2", "b3", "b4"]
    assert len(plan.preemptions) == 4
    assert {p.for_job for p in plan.preemptions} == {"b1", "b2", "b3", "b4"}
    evicted_jobs = {j for p in plan.preemptions for j in p.job_ids}
    assert not evicted_jobs & {j for p in plan.placements for j in p.job_ids}
    held = {a.build().id: a.build() for a in allocs}
    for p in plan.placements:  # every evicted card goes to the job it was evicted for
        evicted = {g for v in p.preempts for g in held[v].gpu_indices}
        assert len(p.preempts) == 1
        assert evicted <= set(p.gpu_indices)
    for p in plan.preemptions:
        assert p.reason.startswith("reclaim: team b is owed its quota of 20 GPUs; team a held ")
        assert "over its quota of 20" in p.reason


def test_borrowed_flags_follow_usage_after_a_reclaim() -> None:
    plan, allocs = _issue_48(now=61.0, b_running=1)
    flags = {a.build().id: a.build().borrowed for a in allocs}
    flags.update(dict(plan.reflags))
    evicted = {p.allocation_id for p in plan.preemptions}
    left = [k for k in flags if k.startswith("a") and k not in evicted]
    assert len(left) == 6  # 18 GPUs, within a's quota of 20: nothing of a's is borrowed
    assert not any(flags[k] for k in left)


def test_flags_are_given_back_when_the_quota_holders_work_ends() -> None:
    allocs = [
        alloc("old", "n").cards(0, 1).set(team="a", started_at=0.0),
        alloc("young", "n").cards(2, 3).set(team="a", started_at=5.0, borrowed=True),
        alloc("younger", "n").cards(4, 5).set(team="a", started_at=9.0, borrowed=True),
    ]
    nodes = [node("n").gpus(8)]
    plan = schedule(snapshot(nodes, [], allocs, [team("a", 2)]), now=10.0)
    assert plan.reflags == ()  # 6 of 2: the two youngest cover the 4 borrowed
    plan = schedule(snapshot(nodes, [], allocs[1:], [team("a", 2)]), now=10.0)
    assert plan.reflags == (("young", False),)  # "old" ended: the oldest left keeps the quota
    plan = schedule(snapshot(nodes, [], allocs[:1], [team("a", 1)]), now=10.0)
    assert plan.reflags == (("old", True),)  # the quota went down to 1


def test_the_node_whose_evicted_cards_the_job_would_use_wins() -> None:
    # "big" frees 6 cards on a node with none free (2 left idle by a 4-GPU job), "small"
    # frees 3 next to 1 free card (none idle): one eviction either way
    allocs = [
        alloc("big", "x").cards(*range(6)).set(team="a", started_at=0.0, borrowed=True),
        alloc("x-rest", "x").cards(6, 7).set(team="a", started_at=0.0),
        alloc("small", "y").cards(0, 1, 2).set(team="a", started_at=0.0, borrowed=True),
        alloc("y-rest", "y").cards(3, 4, 5, 6).set(team="a", started_at=0.0),
    ]
    nodes = [node("x").gpus(8), node("y").gpus(8)]
    jobs = [job("b").gpus(4).set(team="b")]
    plan = schedule(snapshot(nodes, jobs, allocs, [team("a", 0), team("b", 4)]), now=NOW)
    assert [p.allocation_id for p in plan.preemptions] == ["small"]


def test_a_priority_eviction_names_the_classes() -> None:
    allocs = busy("n", 1, team="t", priority="free")
    jobs = [job("p").gpus(1).set(team="t", priority="paid")]
    plan = schedule(snapshot([node("n").gpus(1)], jobs, allocs), now=NOW)
    assert [p.reason for p in plan.preemptions] == ["priority: paid outranks free; for p"]


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
