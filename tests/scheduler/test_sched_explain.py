"""Unplaced jobs carry reasons with node counts and a remedy."""

from __future__ import annotations

from scheduler_builders import alloc, job, node, snapshot

from corral.scheduler import ReasonCode, Remedy, schedule


def test_reasons_count_nodes_per_cause_and_mention_missing_models() -> None:
    nodes = [node(f"small{i}").gpus(1, vram_gib=16) for i in range(4)]
    nodes += [node("paused").gpus(1).paused()]
    nodes += [node(f"busy{i}").gpus(1, vram_gib=48) for i in range(2)]
    allocs = [alloc(f"x{i}", f"busy{i}").cards(0) for i in range(2)]
    plan = schedule(snapshot(nodes, [job("j").gpus(1).vram(40).set(model="sdxl-base")], allocs))
    (left,) = plan.unplaced
    assert left.summary() == (
        "4 nodes: insufficient VRAM for 1 GPU; 2 nodes: not enough free GPU capacity for 1 GPU; "
        "1 node: paused; 2 nodes: missing model sdxl-base (downloadable)"
    )
    counts = {r.code: r.nodes for r in left.reasons}
    assert counts[ReasonCode.INSUFFICIENT_VRAM] == 4
    assert counts[ReasonCode.NODE_PAUSED] == 1
    assert counts[ReasonCode.MODEL_MISSING] == 2
    assert left.remedy is Remedy.WAIT  # two nodes could run it once they are free


def test_every_node_is_counted_once_under_its_first_failing_filter() -> None:
    nodes = [node("lost").gpus(8).lost().label(rack="r9"), node("r1").gpus(8).label(rack="r1")]
    plan = schedule(snapshot(nodes, [job("j").gpus(1).select(rack="r2")]))
    (left,) = plan.unplaced
    assert {r.code: r.nodes for r in left.reasons} == {
        ReasonCode.NODE_NOT_READY: 1,
        ReasonCode.SELECTOR_MISMATCH: 1,
    }
    assert "rack=r2" in left.summary()
    assert left.remedy is Remedy.NONE


def test_an_empty_cluster_says_so() -> None:
    plan = schedule(snapshot([], [job("j").gpus(1)]))
    (left,) = plan.unplaced
    assert left.remedy is Remedy.NONE
    assert "no nodes" in left.summary()


def test_positions_follow_the_order_of_consideration() -> None:
    jobs = [job(f"j{i}").gpus(2).set(submitted_at=i) for i in range(3)]
    plan = schedule(snapshot([node("n").gpus(2)], jobs))
    assert [(u.job_id, u.position) for u in plan.unplaced] == [("j1", 1), ("j2", 2)]
