"""Host memory requests through ``schedule`` and the kept ``Scheduler``: a job fits a node
only with its memory free, waits with ``insufficient_memory`` otherwise, and preemption
counts memory as it counts cards."""

from __future__ import annotations

from dataclasses import replace

from scheduler_builders import alloc, job, node, snapshot

from corral.core import GIB, Allocation, AllocObserved, Gpu, Job, Node, ResourceRequest
from corral.scheduler import ReasonCode, Remedy, Scheduler, schedule

NOW = 10_000.0


def test_a_job_goes_where_its_memory_is_free() -> None:
    nodes = [
        node("small").gpus(2).memory(16),
        node("big").gpus(2).memory(64),
    ]
    plan = schedule(snapshot(nodes, [job("a").gpus(1).memory(32)]))
    assert [(p.node, p.memory_bytes) for p in plan.placements] == [("big", 32 * GIB)]


def test_a_job_waits_beside_free_gpus_when_memory_is_taken_and_says_why() -> None:
    held = [alloc("x", "n").cards(0).set(memory_bytes=40 * GIB)]
    plan = schedule(snapshot([node("n").gpus(4).memory(64)], [job("a").gpus(1).memory(32)], held))
    assert not plan.placements
    (left,) = plan.unplaced
    assert [r.code for r in left.reasons] == [ReasonCode.INSUFFICIENT_MEMORY]
    assert left.summary() == "1 node: not enough free memory for 32 GiB"
    assert left.remedy is Remedy.WAIT  # the node has the memory once x ends


def test_a_node_that_never_has_the_memory_rules_the_job_out() -> None:
    nodes = [node("n").gpus(4).memory(16), node("old").gpus(4)]  # old reports none
    plan = schedule(snapshot(nodes, [job("a").gpus(0.5).memory(24)]))
    (left,) = plan.unplaced
    assert [(r.code, r.nodes) for r in left.reasons] == [(ReasonCode.INSUFFICIENT_MEMORY, 2)]
    assert left.remedy is Remedy.NONE


def test_memory_adds_up_exactly_over_jobs_and_kinds() -> None:
    # a CPU job, a shared card and a whole card: 3 x 20 GiB of 64, a fourth waits
    jobs = [job("c").cpus(1).memory(20), job("s").gpus(0.5).memory(20)]
    jobs += [job("w").gpus(1).memory(20), job("late").gpus(1).memory(20)]
    plan = schedule(snapshot([node("n").gpus(4).memory(64)], jobs))
    assert [p.memory_bytes for p in plan.placements] == [20 * GIB] * 3
    assert "c" in {p.job_ids[0] for p in plan.placements}  # CPU work counts memory too
    (left,) = plan.unplaced
    assert left.reasons[0].code is ReasonCode.INSUFFICIENT_MEMORY


def test_a_gang_s_replicas_each_need_their_memory() -> None:
    nodes = [node(f"n{i}").gpus(2).memory(48) for i in range(2)]
    gang = job("g").gpus(1).memory(24).set(replicas=4)
    plan = schedule(snapshot(nodes, [gang]))
    assert sorted(p.node for p in plan.placements) == ["n0", "n0", "n1", "n1"]
    too_big = job("h").gpus(1).memory(32).set(replicas=4)  # one replica per node at most
    assert not schedule(snapshot(nodes, [too_big])).placements


def test_preemption_frees_memory_a_job_needs_beside_free_cards() -> None:
    held = [alloc("x", "n").cards(0).set(memory_bytes=48 * GIB, priority="free", started_at=0.0)]
    urgent = job("p").gpus(1).memory(32).set(priority="paid")
    plan = schedule(snapshot([node("n").gpus(4).memory(64)], [urgent], held), now=NOW)
    assert [p.allocation_id for p in plan.preemptions] == ["x"]
    assert [p.job_ids for p in plan.placements] == [("p",)]


def test_the_kept_scheduler_gives_memory_back_when_work_ends() -> None:
    cards = tuple(Gpu(i, "A100", 80 * GIB) for i in range(4))
    sched = Scheduler((Node("n", gpus=cards, cpus=8, memory_bytes=64 * GIB),))
    first = Allocation(
        "x",
        ("x",),
        "n",
        gpu_indices=(0,),
        gpu_milli=1000,
        cpus=1,
        memory_bytes=48 * GIB,
        observed=AllocObserved.RUNNING,
    )
    sched.start(first, None)
    sched.submit(Job("a", ResourceRequest(gpus=1, memory_bytes=32 * GIB)))
    assert not sched.schedule(1.0).placements
    sched.end("x")
    assert [p.memory_bytes for p in sched.schedule(2.0).placements] == [32 * GIB]


def test_a_request_that_differs_only_in_memory_is_another_need() -> None:
    # equal requests share a cache of needs: memory must be part of the key
    plain = ResourceRequest(gpus=1)
    assert plain != replace(plain, memory_bytes=GIB)
    assert hash(plain) != hash(replace(plain, memory_bytes=GIB))
