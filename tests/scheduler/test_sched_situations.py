"""The three situations of issue 4, on 4 nodes x 10 GPUs with two teams of quota 20."""

from __future__ import annotations

from scheduler_builders import job, node, team
from scheduler_replay import World

from corral.core import Job
from corral.scheduler import Config

LATER = 3600.0  # well past the minimum run time before preemption


def cluster(borrow: float | None = 20) -> World:
    nodes = [node(f"n{i}").gpus(10).build() for i in range(1, 5)]
    return World(nodes, [team("a", 20, borrow), team("b", 20, borrow)], Config())


def gpus_jobs(team_name: str, count: int, gpus: int, submitted: float = 0.0) -> list[Job]:
    return [
        job(f"{team_name}{i}")
        .gpus(gpus)
        .set(team=team_name, user=f"{team_name}-user", submitted_at=submitted + i)
        .build()
        for i in range(count)
    ]


def test_greedy_team_submitting_together_gets_only_its_quota() -> None:
    world = cluster()
    world.submit(*gpus_jobs("a", 30, 1), *gpus_jobs("b", 20, 1, submitted=100))
    plan = world.cycle(now=0)
    assert world.gpus_of("b") == 20
    assert world.gpus_of("a") == 20
    assert not plan.preemptions
    assert len(plan.unplaced) == 10
    assert all(u.job_id.startswith("a") for u in plan.unplaced)


def test_greedy_team_that_came_first_gives_back_its_borrowed_gpus() -> None:
    world = cluster()
    world.submit(*gpus_jobs("a", 30, 1))
    world.cycle(now=0)
    assert world.gpus_of("a") == 30
    assert sum(a.borrowed for a in world.running("a")) == 10

    world.submit(*gpus_jobs("b", 20, 1, submitted=100))
    plan = world.cycle(now=LATER)
    assert world.gpus_of("b") == 20
    assert world.gpus_of("a") == 20
    assert len(plan.preemptions) == 10
    evicted = {p.allocation_id for p in plan.preemptions}
    assert all(a.borrowed for a in world.plans[0].placements if a.allocation_id in evicted)


def test_fragmentation_big_job_finds_a_whole_node_without_preempting() -> None:
    world = cluster()
    world.submit(*gpus_jobs("a", 6, 3))
    world.cycle(now=0)
    assert len(world.running("a")) == 6
    world.submit(job("big").gpus(8).set(team="b", user="bob", submitted_at=50).build())
    plan = world.cycle(now=LATER)
    assert [p.job_ids for p in plan.placements] == [("big",)]
    assert not plan.preemptions


def test_idle_quota_is_lent_then_reclaimed_with_only_as_many_preemptions_as_needed() -> None:
    world = cluster()
    world.submit(*gpus_jobs("a", 35, 1))
    world.cycle(now=0)
    assert world.gpus_of("a") == 35  # B is idle: A borrows 15 of B's GPUs

    world.submit(*gpus_jobs("b", 10, 1, submitted=100))
    plan = world.cycle(now=LATER)
    assert world.gpus_of("b") == 10
    assert len(plan.preemptions) == 5  # 5 GPUs were free; only 5 more were needed
    assert world.gpus_of("a") == 30


def test_reclaim_waits_for_the_minimum_run_time() -> None:
    world = cluster()
    world.submit(*gpus_jobs("a", 40, 1))
    world.cycle(now=0)
    world.submit(*gpus_jobs("b", 2, 1, submitted=100))
    plan = world.cycle(now=10)  # A's work is 10 s old: below the 60 s minimum
    assert not plan.preemptions
    assert {u.remedy.value for u in plan.unplaced} == {"preempt"}
    plan = world.cycle(now=LATER)
    assert len(plan.preemptions) == 2
