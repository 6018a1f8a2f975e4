"""A GPU job's CPUs come from its GPUs' NUMA nodes, when the node reported them."""

from __future__ import annotations

from scheduler_builders import alloc, job, node, snapshot

from corral.scheduler import Config, ReasonCode, schedule


def two_sockets(report: bool = True, cpus: float = 8):  # type: ignore[no-untyped-def]
    """Four GPUs, two on each NUMA node, ``cpus`` CPUs on each."""
    n = node("n").gpus(4)
    return n.numa((0, 0, 1, 1), (cpus, cpus)) if report else n.cpus(int(2 * cpus))


def placed_cards(plan, job_id: str) -> tuple[int, ...] | None:  # type: ignore[no-untyped-def]
    for p in plan.placements:
        if job_id in p.job_ids:
            return p.gpu_indices  # type: ignore[no-any-return]
    return None


def reasons(plan, job_id: str) -> set[ReasonCode]:  # type: ignore[no-untyped-def]
    left = {u.job_id: u for u in plan.unplaced}
    return {r.code for r in left[job_id].reasons}


def test_a_gpu_job_takes_a_gpu_whose_numa_node_has_its_cpus() -> None:
    # NUMA node 0 has 1 CPU left beside its free GPU 1; node 1 has 8 beside GPUs 2 and 3
    held = [alloc("x", "n").cards(0).set(cpus=7)]
    plan = schedule(snapshot([two_sockets()], [job("j").gpus(1).cpus(4)], held), Config(), 100)
    assert placed_cards(plan, "j") == (2,)
    # without the report the node's CPUs are one pool: the first free GPU
    plan = schedule(
        snapshot([two_sockets(report=False)], [job("j").gpus(1).cpus(4)], held), Config(), 100
    )
    assert placed_cards(plan, "j") == (1,)


def test_a_job_is_not_placed_where_its_gpus_numa_node_lacks_cpus() -> None:
    # GPU 1 is the only free one; its NUMA node has 1 CPU free, the node 7
    held = [
        alloc("x", "n").cards(0).set(cpus=7),
        alloc("y", "n").cards(2, 3).set(cpus=2),
    ]
    plan = schedule(snapshot([two_sockets()], [job("j").gpus(1).cpus(4)], held), Config(), 100)
    assert placed_cards(plan, "j") is None
    assert ReasonCode.INSUFFICIENT_NUMA_CPUS in reasons(plan, "j")
    left = {u.job_id: u for u in plan.unplaced}
    assert "NUMA node" in left["j"].summary()
    # a job asking for the one CPU there fits
    plan = schedule(snapshot([two_sockets()], [job("k").gpus(1).cpus(1)], held), Config(), 100)
    assert placed_cards(plan, "k") == (1,)
    # the same node without the report: the pool has 7 CPUs
    plan = schedule(
        snapshot([two_sockets(report=False)], [job("j").gpus(1).cpus(4)], held), Config(), 100
    )
    assert placed_cards(plan, "j") == (1,)


def test_a_job_whose_gpus_span_numa_nodes_draws_from_them_together() -> None:
    held = [alloc("x", "n").cards(0).set(cpus=6)]  # NUMA node 0: 2 CPUs free, node 1: 8
    plan = schedule(snapshot([two_sockets()], [job("j").gpus(3).cpus(10)], held), Config(), 100)
    assert placed_cards(plan, "j") == (1, 2, 3)


def test_cpus_a_spanning_job_took_are_not_counted_twice() -> None:
    # x leaves NUMA node 0 2 CPUs; z, on GPUs 1 and 2, takes 4 from each GPU's node:
    # node 0 is 2 short, so node 1's 4 free lend it 2 and GPU 3 has 2 CPUs beside it
    held = [alloc("x", "n").cards(0).set(cpus=6), alloc("z", "n").cards(1, 2).set(cpus=8)]
    plan = schedule(snapshot([two_sockets()], [job("j").gpus(1).cpus(3)], held), Config(), 100)
    assert placed_cards(plan, "j") is None
    plan = schedule(snapshot([two_sockets()], [job("j").gpus(1).cpus(2)], held), Config(), 100)
    assert placed_cards(plan, "j") == (3,)


def test_cpu_only_jobs_draw_from_any_numa_node() -> None:
    # 12 CPUs: more than one NUMA node has; the node's 16 are enough
    plan = schedule(snapshot([two_sockets()], [job("c").cpus(12)]), Config(), 100)
    assert [p.node for p in plan.placements] == ["n"]
    held = [alloc("c", "n").set(cpus=12, gpu_indices=(), on_cpu=True)]
    jobs = [job("big").gpus(1).cpus(6), job("small").gpus(1).cpus(4)]
    plan = schedule(snapshot([two_sockets()], jobs, held), Config(), 100)
    assert placed_cards(plan, "small") is not None
    assert ReasonCode.INSUFFICIENT_CPUS in reasons(plan, "big")


def test_numa_cpus_come_back_when_work_is_preempted() -> None:
    # batch work holds NUMA node 0's CPUs (x) and node 1's GPUs (y): GPU 1 is free, the
    # node has 8 CPUs free, none beside GPU 1; y may not be evicted: an interactive job evicts x
    held = [
        alloc("x", "n").cards(0).set(cpus=8, priority="batch", started_at=1),
        alloc("y", "n").cards(2, 3).set(cpus=0, preemptible=False),
    ]
    plan = schedule(
        snapshot([two_sockets()], [job("j").gpus(1).cpus(4).set(priority="interactive")], held),
        Config(),
        100,
    )
    assert [p.allocation_id for p in plan.preemptions] == ["x"], plan.unplaced


def test_a_job_spans_numa_nodes_when_no_one_node_has_its_cpus() -> None:
    # NUMA node 0: GPUs 0 and 1 free, 2 CPUs; node 1: GPU 3 free, 8 CPUs. Two GPUs and
    # 9 CPUs: not GPUs 0 and 1 (2 CPUs beside them) but GPU 3 and one of node 0's
    box = node("n").gpus(6).numa((0, 0, 0, 1, 1, 1), (8, 8))
    held = [alloc("x", "n").cards(2).set(cpus=6), alloc("y", "n").cards(4, 5).set(cpus=0)]
    plan = schedule(snapshot([box], [job("j").gpus(2).cpus(9)], held), Config(), 100)
    assert placed_cards(plan, "j") == (0, 3)
    plan = schedule(snapshot([box], [job("j").gpus(2).cpus(11)], held), Config(), 100)
    assert placed_cards(plan, "j") is None


def test_a_gang_counts_replicas_by_numa_node() -> None:
    # 5 CPUs a replica: the NUMA box's 16 CPUs hold three by count, but 8 per NUMA node
    # hold one each; the gang of three goes to the box that holds it whole
    nodes = [two_sockets(), node("plain").gpus(4).cpus(16)]
    gang = job("g").gpus(1).cpus(5).set(replicas=3)
    plan = schedule(snapshot(nodes, [gang]), Config(), 100)
    assert sorted(p.node for p in plan.placements) == ["plain"] * 3, plan.unplaced
    # a gang of two fits the NUMA box, one replica on each NUMA node
    plan = schedule(snapshot([two_sockets()], [gang.set(replicas=2)]), Config(), 100)
    assert sorted(p.gpu_indices for p in plan.placements) == [(0,), (2,)], plan.unplaced
