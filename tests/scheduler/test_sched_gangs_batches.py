"""Gangs (all replicas or none, on few nodes) and batches of sample jobs."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_builders import alloc, job, node, snapshot

from corral.scheduler import Config, ReasonCode, schedule


def test_a_gang_is_placed_whole_on_the_fewest_nodes() -> None:
    nodes = [node("part").gpus(8), node("w1").gpus(8), node("w2").gpus(8)]
    allocs = [alloc("x", "part").cards(0, 1, 2, 3, 4, 5)]  # 2 cards free on "part"
    plan = schedule(snapshot(nodes, [job("g").gpus(2).set(replicas=4)], allocs))
    per_node = Counter(p.node for p in plan.placements)
    assert sum(per_node.values()) == 4
    assert len(per_node) == 1  # 4 x 2 GPUs fit on one whole node
    assert sorted(p.replica for p in plan.placements) == [0, 1, 2, 3]
    assert len({p.allocation_id for p in plan.placements}) == 4


def test_a_gang_that_does_not_fit_whole_is_not_placed_at_all() -> None:
    nodes = [node("a").gpus(4), node("b").gpus(4)]
    jobs = [job("g").gpus(4).set(replicas=3, submitted_at=0), job("s").gpus(1).set(submitted_at=1)]
    plan = schedule(snapshot(nodes, jobs))
    assert [p.job_ids for p in plan.placements] == [("s",)]  # the capacity was rolled back
    assert plan.unplaced[0].job_id == "g"


def test_a_gang_prefers_nodes_sharing_its_label_value() -> None:
    nodes = [
        node("r1a").gpus(8).label(rack="r1"),
        node("r1b").gpus(8).label(rack="r1"),
        node("r2a").gpus(8).label(rack="r2"),
        node("r2b").gpus(8).label(rack="r2"),
    ]
    allocs = [alloc("x", "r1a").cards(0, 1, 2, 3, 4, 5, 6)]  # rack r1 has 1 + 8 cards free
    gang = job("g").gpus(4).set(replicas=4, gang_label="rack")
    plan = schedule(snapshot(nodes, [gang], allocs))
    assert {p.node for p in plan.placements} == {"r2a", "r2b"}
    unlabelled = schedule(snapshot(nodes, [job("g").gpus(4).set(replicas=4)], allocs))
    assert {p.node for p in unlabelled.placements} == {"r1b", "r2a"}  # what no label gives


def test_a_gang_spans_label_values_when_no_single_value_has_room() -> None:
    nodes = [node("a").gpus(4).label(rack="r1"), node("b").gpus(4).label(rack="r2")]
    plan = schedule(snapshot(nodes, [job("g").gpus(4).set(replicas=2, gang_label="rack")]))
    assert {p.node for p in plan.placements} == {"a", "b"}


def test_compatible_sample_jobs_share_one_allocation_up_to_the_batch_size() -> None:
    jobs = [
        job(f"s{i}").vram(10).sample("sdxl/1024").set(user=f"u{i % 3}", submitted_at=i)
        for i in range(5)
    ]
    jobs.append(job("other").vram(10).sample("flux/512").set(submitted_at=9))
    plan = schedule(snapshot([node("n").gpus(1)], jobs), Config(max_batch_size=3))
    groups = sorted(p.job_ids for p in plan.placements)
    assert groups == [("other",), ("s0", "s1", "s2"), ("s3", "s4")]
    assert len(plan.batches) == 2


def test_sample_jobs_of_different_teams_do_not_share_an_allocation() -> None:
    jobs = [
        job("a").vram(10).sample("k").set(team="t1", submitted_at=0),
        job("b").vram(10).sample("k").set(team="t2", submitted_at=1),
    ]
    plan = schedule(snapshot([node("n").gpus(1)], jobs))
    assert sorted(p.job_ids for p in plan.placements) == [("a",), ("b",)]


def test_jobs_in_backoff_do_not_join_a_batch() -> None:
    jobs = [
        job("a").vram(10).sample("k").set(submitted_at=0),
        job("late").vram(10).sample("k").set(submitted_at=1, not_before=1e9),
    ]
    plan = schedule(snapshot([node("n").gpus(1)], jobs))
    assert [p.job_ids for p in plan.placements] == [("a",)]
    assert plan.unplaced[0].reasons[0].code is ReasonCode.NOT_BEFORE


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=20),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(2, 12),
)
def test_a_gang_lands_whole_on_the_fewest_nodes_that_can_hold_it(
    busy: list[int], per_replica: int, replicas: int
) -> None:
    """Whatever cards are taken where, a gang is placed whole or not at all, and when it is,
    on as few nodes as its replicas can share (the nodes with the most room first)."""
    nodes = [node(f"n{i}").gpus(8) for i in range(len(busy))]
    allocs = [alloc(f"a{i}", f"n{i}").cards(*range(used)) for i, used in enumerate(busy) if used]
    gang = job("g").gpus(per_replica).set(replicas=replicas)
    plan = schedule(snapshot(nodes, [gang], allocs))
    room = sorted(((8 - used) // per_replica for used in busy), reverse=True)
    if sum(room) < replicas:
        assert not plan.placements
        return
    fewest = next(k for k in range(1, len(room) + 1) if sum(room[:k]) >= replicas)
    assert sorted(p.replica for p in plan.placements) == list(range(replicas))
    assert len({p.node for p in plan.placements}) == fewest
    per_node = Counter(p.node for p in plan.placements)
    taken = dict(enumerate(busy))
    assert all(
        count * per_replica <= 8 - taken[int(name[1:])] for name, count in per_node.items()
    ), "no node holds more replicas than it has room for"
