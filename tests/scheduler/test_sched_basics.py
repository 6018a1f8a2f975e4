"""First scenarios: whole GPUs, shared GPUs, CPU-only, unschedulable nodes, priority order."""

from __future__ import annotations

from scheduler_builders import job, node, snapshot

from corral.scheduler import ReasonCode, Remedy, schedule


def test_whole_gpu_job_gets_distinct_free_cards() -> None:
    plan = schedule(snapshot([node("n1").gpus(4)], [job("a").gpus(2), job("b").gpus(2)]))
    cards = [p.gpu_indices for p in plan.placements]
    assert sorted(i for c in cards for i in c) == [0, 1, 2, 3]
    assert not plan.unplaced


def test_shared_jobs_share_one_card_by_vram() -> None:
    jobs = [job(f"s{i}").vram(20) for i in range(4)]  # 4 x 20 GiB on one 80 GiB card
    plan = schedule(snapshot([node("n1").gpus(2)], jobs))
    assert {p.gpu_indices for p in plan.placements} == {(0,)}
    assert all(p.gpu_milli == 250 for p in plan.placements)


def test_cpu_only_job_lands_on_cpu_slots() -> None:
    plan = schedule(snapshot([node("g").gpus(1).cpus(1), node("c").cpus(4)], [job("c1").cpus(4)]))
    assert [(p.node, p.gpu_indices, p.cpus) for p in plan.placements] == [("c", (), 4)]


def test_paused_draining_and_lost_nodes_get_no_work() -> None:
    nodes = [node("p").gpus(8).paused(), node("d").gpus(8).draining(), node("l").gpus(8).lost()]
    plan = schedule(snapshot(nodes, [job("a").gpus(1)]))
    assert not plan.placements
    (left,) = plan.unplaced
    assert {r.code for r in left.reasons} == {
        ReasonCode.NODE_PAUSED,
        ReasonCode.NODE_DRAINING,
        ReasonCode.NODE_NOT_READY,
    }
    assert left.remedy is Remedy.NONE


def test_higher_priority_class_is_served_first() -> None:
    jobs = [job("cheap").gpus(1).set(priority="batch"), job("vip").gpus(1).set(priority="paid")]
    plan = schedule(snapshot([node("n1").gpus(1)], jobs))
    assert [p.job_ids for p in plan.placements] == [("vip",)]
    assert plan.unplaced[0].job_id == "cheap"
    assert plan.unplaced[0].remedy is Remedy.WAIT


def test_an_allocation_id_is_the_job_id_and_its_attempt_number() -> None:
    """``<job>/<attempt>`` (``/r<replica>`` added for a gang's replicas), the attempt
    counted from 1, for first tries and for retries past the ids kept ready-made."""
    jobs = [
        job("a").gpus(1),
        job("b").gpus(1).set(attempt=2),
        job("c").gpus(1).set(attempt=40),
        job("g").gpus(8).set(replicas=2, attempt=1),
    ]
    plan = schedule(snapshot([node("n1").gpus(8), node("n2").gpus(8), node("n3").gpus(8)], jobs))
    assert sorted(p.allocation_id for p in plan.placements) == [
        "a/1",
        "b/3",
        "c/41",
        "g/2/r0",
        "g/2/r1",
    ]
