"""The fragmentation measure, and that packing keeps it low."""

from __future__ import annotations

import pytest
from scheduler_builders import JobBuilder, NodeBuilder, alloc, job, node, snapshot
from scheduler_replay import World

from corral.scheduler import fragmentation, schedule
from corral.scheduler.fragmentation import of_free


def test_an_empty_cluster_is_not_fragmented() -> None:
    report = fragmentation(snapshot([node("a").gpus(8), node("b").gpus(8)]))
    assert report.free_gpus == report.free_in_whole_nodes == 16
    assert report.score == 0.0
    assert report.largest_block == 8
    assert report.usable_for(8) == 2


def test_scattered_free_cards_and_slivers_count_as_fragmentation() -> None:
    allocs = [
        alloc("x", "a").cards(0, 1, 2, 3, 4, 5),  # a: 2 free
        alloc("y", "b").cards(0, milli=500),  # b: 7 free + half a card stranded
    ]
    report = fragmentation(snapshot([node("a").gpus(8), node("b").gpus(8)], allocs=allocs))
    assert report.free_gpus == 9
    assert report.free_in_whole_nodes == 0
    assert report.stranded_milli == 500
    assert report.score == pytest.approx(1.0)
    assert report.blocks == {2: 1, 7: 1}
    assert report.usable_for(4) == 1


def test_free_cards_give_what_the_allocations_holding_the_rest_give() -> None:
    # ``of_free``: a shell that keeps each card's free milli-GPUs (the simulator's world)
    # measures without walking allocations; the layout above, from what is free.
    nodes = [node("a").gpus(8), node("b").gpus(8), node("c").gpus(2)]
    free = [[0] * 6 + [1000] * 2, [500] + [1000] * 7, [1000, 1000]]
    report = of_free([n.build() for n in nodes], free)
    assert (report.free_gpus, report.free_in_whole_nodes, report.stranded_milli) == (11, 2, 500)
    assert report.blocks == {2: 2, 7: 1}
    allocs = [alloc("x", "a").cards(0, 1, 2, 3, 4, 5), alloc("y", "b").cards(0, milli=500)]
    assert report == fragmentation(snapshot(nodes, allocs=allocs))


def test_paused_nodes_do_not_count() -> None:
    report = fragmentation(snapshot([node("a").gpus(8).paused(), node("b").gpus(4)]))
    assert report.total_gpus == 4


def test_packing_small_jobs_keeps_whole_nodes_whole() -> None:
    world = World([node(f"n{i}").gpus(8).build() for i in range(4)])
    world.submit(*[job(f"j{i}").gpus(1 + i % 3).set(submitted_at=i).build() for i in range(10)])
    world.cycle(now=0)
    report = fragmentation(world.snapshot)
    used = sum(1 + i % 3 for i in range(10))  # 19 cards: fits on 3 nodes
    assert report.free_gpus == 32 - used
    assert report.free_in_whole_nodes == 8  # one node left whole


def _placed_on(nodes: list[NodeBuilder], *jobs: JobBuilder) -> dict[str, str]:
    plan = schedule(snapshot(nodes, list(jobs)))
    return {p.job_ids[0]: p.node for p in plan.placements}


def test_a_cpu_hungry_job_leaves_a_small_node_s_cards_their_cpus() -> None:
    # the 2-card node is the tighter fit, but 12 of its 16 CPUs would leave its other card
    # with 4: less than a card's share (8); the 8-card node keeps CPUs beside its cards
    nodes = [node("small").gpus(2).cpus(16), node("big").gpus(8).cpus(96)]
    assert _placed_on(nodes, job("hungry").gpus(1).cpus(12)) == {"hungry": "big"}
    assert _placed_on(nodes, job("modest").gpus(1).cpus(6)) == {"modest": "small"}


def test_a_job_that_strands_cpus_everywhere_still_runs() -> None:
    nodes = [node("small").gpus(2).cpus(16)]
    assert _placed_on(nodes, job("hungry").gpus(1).cpus(12)) == {"hungry": "small"}


def test_cpu_work_keeps_off_the_cpus_that_free_cards_need() -> None:
    # neither node is without free cards; on "lean" the job would leave 2 CPUs beside 2
    # free cards (a card's share is 8), on "roomy" 56 beside 8
    nodes = [node("lean").gpus(2).cpus(16), node("roomy").gpus(8).cpus(64)]
    assert _placed_on(nodes, job("c").cpus(14)) == {"c": "roomy"}


def test_a_job_goes_where_the_cpus_left_still_serve_the_free_cards() -> None:
    # both nodes have four free cards; on "lean" (8 CPUs a card) 12 CPUs would leave 20
    # beside three cards, enough for two and a half of them at its share: "roomy" (16 a
    # card) strands none, though it comes later in the search
    nodes = [node("lean").gpus(4).cpus(32), node("roomy").gpus(4).cpus(64)]
    assert _placed_on(nodes, job("hungry").gpus(1).cpus(12)) == {"hungry": "roomy"}
    assert _placed_on(nodes, job("modest").gpus(1).cpus(8)) == {"modest": "lean"}


def test_memory_left_beside_free_cards_is_weighed_as_cpus_are() -> None:
    nodes = [node("lean").gpus(4).memory(128), node("roomy").gpus(4).memory(512)]
    assert _placed_on(nodes, job("hungry").gpus(1).memory(48)) == {"hungry": "roomy"}
    assert _placed_on(nodes, job("modest").gpus(1).memory(32)) == {"modest": "lean"}


def test_where_every_fit_strands_some_the_one_stranding_least_is_taken() -> None:
    # 12 CPUs leave "lean" 20 for three cards (a share of 8: half a card unserved) and
    # "leaner" 12 for three (a share of 6: one card unserved)
    nodes = [node("leaner").gpus(4).cpus(24), node("lean").gpus(4).cpus(32)]
    assert _placed_on(nodes, job("hungry").gpus(1).cpus(12)) == {"hungry": "lean"}


def test_a_job_breaking_a_whole_node_breaks_the_smallest_of_its_kind() -> None:
    # two wholly free 8-card nodes: the one with more CPUs (then more memory) is the only
    # one a job asking for 120 CPUs fits, so a small job starts on the other
    nodes = [node("big").gpus(8).cpus(128), node("plain").gpus(8).cpus(96)]
    assert _placed_on(nodes, job("small").gpus(1).cpus(4)) == {"small": "plain"}
    roomy = [node("roomy").gpus(8).memory(768), node("plain").gpus(8).memory(384)]
    assert _placed_on(roomy, job("small").gpus(1).memory(16)) == {"small": "plain"}
    both = [node("big").gpus(8).cpus(128), node("plain").gpus(8).cpus(96)]
    placed = _placed_on(both, job("large").gpus(8).cpus(120), job("small").gpus(1).cpus(4))
    assert placed == {"large": "big", "small": "plain"}
