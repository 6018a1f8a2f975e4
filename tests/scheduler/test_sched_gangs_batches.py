"""Gangs (all replicas or none, on few nodes) and batches of sample jobs."""

from __future__ import annotations

from collections import Counter
from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_builders import alloc, job, node, snapshot

from corral.core import Gpu, Node
from corral.scheduler import Config, ReasonCode, schedule
from corral.scheduler.cycle import Cycle
from corral.scheduler.gang import _fewest_nodes, _room
from corral.scheduler.need import need_of
from corral.scheduler.node_cap import NodeCap


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


def _fewest_nodes_by_sorting(
    room: list[tuple[NodeCap, int]], replicas: int
) -> list[tuple[NodeCap, int]] | None:
    """``gang._fewest_nodes`` as it was written first: every node with room sorted."""
    if sum(count for _, count in room) < replicas:
        return None
    ordered = sorted(room, key=lambda item: (-item[1], item[0].whole_free, item[0].idx))
    chosen: list[tuple[NodeCap, int]] = []
    left = replicas
    for nc, count in ordered:
        if left <= 0:
            break
        chosen.append((nc, min(count, left)))
        left -= count
    last_nc, last_count = chosen[-1]
    used = {nc.idx for nc, _ in chosen}
    last_room = next(count for nc, count in room if nc is last_nc)
    tighter = [
        (nc, count)
        for nc, count in room
        if nc.idx not in used and count >= last_count and count < last_room
    ]
    if tighter:
        nc, _ = min(tighter, key=lambda item: (item[1], item[0].whole_free, item[0].idx))
        chosen[-1] = (nc, last_count)
    return chosen


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, 6)), max_size=30),
    st.integers(2, 12),
    st.randoms(use_true_random=False),
)
def test_a_gang_picks_the_nodes_a_full_sort_would(
    nodes: list[tuple[int, int]], replicas: int, rnd: Random
) -> None:
    """Picking the most-room and tightest nodes by walks gives what sorting every node did
    (ties in count and free cards broken by node index, whatever the room's order)."""
    room = []
    cards = tuple(Gpu(i, "H100", 80 << 30) for i in range(8))
    for idx, (whole_free, count) in enumerate(nodes):
        nc = NodeCap(idx, Node(f"n{idx}", gpus=cards), 0)
        nc.whole_free = whole_free
        room.append((nc, count))
    rnd.shuffle(room)
    assert _fewest_nodes(room, replicas) == _fewest_nodes_by_sorting(room, replicas)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=20),
    st.integers(2, 4),
    st.sets(st.integers(0, 19)),
)
def test_a_gang_of_whole_nodes_stops_walking_once_it_has_them(
    busy: list[int], replicas: int, paused: set[int]
) -> None:
    """A gang whose replicas take every card of the largest nodes stops its walk after
    ``replicas`` nodes with room (``gang._room``): the same nodes as looking at all."""
    nodes = [node(f"n{i}").gpus(8) for i in range(len(busy))]
    for i in paused & set(range(len(busy))):
        nodes[i].paused()
    allocs = [alloc(f"a{i}", f"n{i}").cards(*range(used)) for i, used in enumerate(busy) if used]
    cycle = Cycle(snapshot(nodes, allocs=allocs), Config(), 0.0)
    need = need_of(job("g").gpus(8).set(replicas=replicas).build())
    walked = _room(cycle, need, replicas, None)
    every = _room(cycle, need, replicas, "rack")  # a label: every node with room is listed
    assert walked == every[:replicas]
    assert _fewest_nodes(walked, replicas) == _fewest_nodes(every, replicas)
