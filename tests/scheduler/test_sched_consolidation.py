"""Consolidation: running work moves to another node when, and only when, that lets a
waiting job run."""

from __future__ import annotations

from scheduler_builders import alloc, job, node, snapshot

from corral.scheduler import Config, Plan, schedule

NOW = 10_000.0


def _scattered(**fields: object) -> Plan:
    """Two 4-GPU nodes with two free cards each, and a 2-GPU job on each that would fit in
    the other's free pair; "mover" checkpointed a second ago. A 4-GPU job waits.
    ``fields``: of both running jobs."""
    both = {"team": "t", "started_at": 0.0, **fields}
    allocs = [
        alloc("mover", "x").cards(0, 1).set(**{"last_checkpoint_at": NOW - 1, **both}),
        alloc("stays", "y").cards(0, 1).set(**{"last_checkpoint_at": 5.0, **both}),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    return schedule(snapshot(nodes, [job("big").gpus(4).set(team="t")], allocs), now=NOW)


def test_a_job_that_fits_elsewhere_moves_so_that_a_waiting_one_runs() -> None:
    plan = _scattered()
    (move,) = plan.preemptions
    assert move.move_to in {"x", "y"}
    assert move.move_to != move.node
    (placed,) = plan.placements
    assert placed.job_ids == ("big",)
    assert placed.node == move.node
    assert placed.preempts == (move.allocation_id,)
    assert move.reason.startswith("consolidation: ")
    assert "where it fits now" in move.reason


def test_the_job_that_loses_least_work_is_moved() -> None:
    # "stays" checkpointed long ago; "mover" a second ago: moving it loses least
    plan = _scattered()
    assert [p.allocation_id for p in plan.preemptions] == ["mover"]
    allocs = [
        alloc("old", "x").cards(0, 1).set(team="t", started_at=0.0),
        alloc("fresh", "y").cards(0, 1).set(team="t", started_at=0.0, last_checkpoint_at=NOW),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    plan = schedule(snapshot(nodes, [job("big").gpus(4).set(team="t")], allocs), now=NOW)
    assert [p.allocation_id for p in plan.preemptions] == ["fresh"]


def test_nothing_moves_with_preemption_off() -> None:
    allocs = [
        alloc("mover", "x").cards(0, 1).set(team="t", started_at=0.0),
        alloc("stays", "y").cards(0, 1).set(team="t", started_at=0.0),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    waiting = snapshot(nodes, [job("big").gpus(4).set(team="t")], allocs)
    assert len(schedule(waiting, Config(), now=NOW).preemptions) == 1
    plan = schedule(waiting, Config(preemption=False), now=NOW)
    assert plan.preemptions == ()
    assert plan.placements == ()


def test_nothing_moves_when_the_waiting_job_would_not_fit_anyway() -> None:
    allocs = [
        alloc("m1", "x").cards(0, 1).set(team="t", started_at=0.0),
        alloc("m2", "y").cards(0, 1).set(team="t", started_at=0.0),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    plan = schedule(snapshot(nodes, [job("huge").gpus(6).set(team="t")], allocs), now=NOW)
    assert plan.preemptions == ()
    assert plan.placements == ()


def test_nothing_moves_that_has_nowhere_to_go() -> None:
    allocs = [
        alloc("m1", "x").cards(0, 1, 2).set(team="t", started_at=0.0),
        alloc("m2", "y").cards(0, 1, 2).set(team="t", started_at=0.0),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    plan = schedule(snapshot(nodes, [job("two").gpus(2).set(team="t")], allocs), now=NOW)
    assert plan.preemptions == ()


def test_young_non_preemptible_and_gang_work_never_moves() -> None:
    assert (
        _scattered(started_at=NOW - 1, last_checkpoint_at=None).preemptions == ()
    )  # inside its minimum run time
    assert _scattered(preemptible=False).preemptions == ()
    assert _scattered(priority="paid").preemptions == ()  # a higher class than the waiting job's
    allocs = [
        alloc("g0", "x").cards(0, 1).set(team="t", started_at=0.0, job_ids=("g",)),
        alloc("g1", "y").cards(0, 1).set(team="t", started_at=0.0, job_ids=("g",), replica=1),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    plan = schedule(snapshot(nodes, [job("big").gpus(4).set(team="t")], allocs), now=NOW)
    assert plan.preemptions == ()


def test_moves_per_cycle_are_bounded_and_may_be_switched_off() -> None:
    allocs, nodes, jobs = [], [], []
    for k in range(4):  # four pairs of half-full nodes, four 4-GPU jobs waiting
        for side in "ab":
            nodes.append(node(f"{side}{k}").gpus(4))
            allocs.append(alloc(f"{side}{k}", f"{side}{k}").cards(0, 1).set(started_at=0.0))
        jobs.append(job(f"big{k}").gpus(4))
    plan = schedule(snapshot(nodes, jobs, allocs), Config(consolidation_moves=2), now=NOW)
    assert len(plan.preemptions) == 2
    assert len(plan.placements) == 2
    plan = schedule(snapshot(nodes, jobs, allocs), Config(consolidation_moves=0), now=NOW)
    assert plan.preemptions == ()
    plan = schedule(snapshot(nodes, jobs, allocs), now=NOW)  # the default: four
    assert len(plan.preemptions) == 4
    assert {p.move_to for p in plan.preemptions}.isdisjoint({p.node for p in plan.placements})


def test_a_move_keeps_the_moved_jobs_borrowed_flag() -> None:
    plan = _scattered(borrowed=True)
    assert len(plan.preemptions) == 1
    assert plan.reflags == ()


def test_a_node_whose_backend_lacks_the_jobs_model_is_not_cleared_for_it() -> None:
    allocs = [
        alloc("mover", "x").cards(0, 1).set(team="t", started_at=0.0, last_checkpoint_at=NOW),
        alloc("stays", "y").cards(0, 1).set(team="t", started_at=0.0),
    ]
    nodes = [node("x").gpus(4), node("y").gpus(4)]
    jobs = [job("big").gpus(4).set(team="t", lacking_nodes=frozenset({"x"}))]
    plan = schedule(snapshot(nodes, jobs, allocs), now=NOW)
    assert [p.allocation_id for p in plan.preemptions] == ["stays"]  # x's is cheaper, but
    assert [p.node for p in plan.placements] == ["y"]
