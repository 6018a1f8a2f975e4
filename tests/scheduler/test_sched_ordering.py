"""Order of service: classes by rank, users round robin (weighted), teams by borrowed share."""

from __future__ import annotations

from dataclasses import replace

from scheduler_builders import alloc, job, node, snapshot, team

from corral.core import Job
from corral.scheduler import Config, schedule
from corral.scheduler.ordering import FairQueue


def jobs_of(user: str, count: int, start: float = 0.0) -> list[Job]:
    return [
        job(f"{user}{i}").gpus(1).set(user=user, submitted_at=start + i).build()
        for i in range(count)
    ]


def test_round_robin_serves_every_user_before_anyone_twice() -> None:
    queue = FairQueue(jobs_of("a", 5) + jobs_of("b", 2, 100) + jobs_of("c", 1, 200), {}, {})
    order = [j.id for j in queue]
    assert order[:3] == ["a0", "b0", "c0"]
    assert order[3:5] == ["a1", "b1"]


def test_a_user_with_weight_two_gets_two_turns_per_round() -> None:
    queue = FairQueue(jobs_of("a", 6) + jobs_of("b", 6, 100), {"a": 2.0}, {})
    first_six = [j.user for j in list(queue)[:6]]
    assert first_six.count("a") == 4


def test_ties_go_to_the_user_with_less_running_work() -> None:
    queue = FairQueue(jobs_of("a", 2) + jobs_of("b", 2, 100), {}, {"a": 5})
    assert next(iter(queue)).user == "b"


def test_user_weights_come_from_the_config() -> None:
    jobs = (*jobs_of("a", 4), *jobs_of("b", 4, 100))
    snap = replace(snapshot([node("n").gpus(3)]), queued=jobs)
    plan = schedule(snap, Config(user_weights={"b": 2.0}))
    users = sorted(j[0] for p in plan.placements for j in p.job_ids)
    assert users == ["a", "b", "b"]


def test_borrowing_goes_first_to_the_team_that_borrows_least_per_weight() -> None:
    allocs = [alloc("a-old", "n").cards(0, 1).set(team="a", borrowed=True)]
    jobs = [
        job("a1").gpus(1).set(team="a", submitted_at=0),
        job("b1").gpus(1).set(team="b", submitted_at=5),
    ]
    plan = schedule(snapshot([node("n").gpus(3)], jobs, allocs, [team("a", 0), team("b", 0)]))
    assert [p.job_ids for p in plan.placements] == [("b1",)]


def test_within_quota_work_of_any_team_goes_before_anyone_borrows() -> None:
    jobs = [
        job("borrow").gpus(1).set(team="a", priority="interactive", submitted_at=0),
        job("owed").gpus(1).set(team="b", priority="batch", submitted_at=9),
    ]
    plan = schedule(snapshot([node("n").gpus(1)], jobs, teams=[team("a", 0), team("b", 1)]))
    assert [p.job_ids for p in plan.placements] == [("owed",)]
    assert not plan.placements[0].borrowed


def test_work_that_ends_together_shares_a_node() -> None:
    nodes = [node("soon").gpus(4), node("late").gpus(4)]
    allocs = [alloc("s", "soon").cards(0), alloc("l", "late").cards(0)]
    snap = snapshot(nodes, [job("long").gpus(1).set(estimated_runtime_s=4_800)], allocs)
    snap = replace(snap, expected_ends={"s": 200.0, "l": 5_000.0})
    plan = schedule(snap, now=100.0)
    assert plan.placements[0].node == "late"
    snap_short = replace(snap, queued=(job("short").gpus(1).set(estimated_runtime_s=100).build(),))
    assert schedule(snap_short, now=100.0).placements[0].node == "soon"


def test_jobs_that_cannot_run_now_do_not_use_their_users_turns() -> None:
    # a's two 4-GPU jobs cannot run (2 of 4 cards are busy); its 1-GPU job still gets
    # a turn in the first round, with b's first job: one card each.
    a = [job(f"a{i}").gpus(4).set(user="a", submitted_at=i) for i in range(2)]
    a.append(job("a2").gpus(1).set(user="a", submitted_at=2))
    b = [job(f"b{i}").gpus(1).set(user="b", submitted_at=10 + i) for i in range(3)]
    snap = snapshot([node("n").gpus(4)], [*a, *b], [alloc("busy", "n").cards(0, 1)])
    plan = schedule(snap, Config(reserve_min_gpus=None))
    assert sorted(j for p in plan.placements for j in p.job_ids) == ["a2", "b0"]


def test_the_live_queue_skips_dead_groups_whole_and_charges_only_placements() -> None:
    from corral.scheduler.ordering import LiveQueue

    small = {"u": [job(f"u{i}").gpus(1).set(user="u").build() for i in range(3)]}
    big = {"u": [job("ubig").gpus(8).set(user="u", submitted_at=-1).build()]}
    other = {"v": [job(f"v{i}").gpus(1).set(user="v", submitted_at=i).build() for i in range(3)]}
    groups = {"small": small, "big": big, "other": other}
    dead = {"big"}
    queue = LiveQueue(groups, {}, {}, lambda g: g not in dead, lambda j: True)
    first = queue.pop()
    assert first is not None
    assert first.id == "u0"  # ubig is older, but its group is dead
    queue.done(first, placed=False)  # not placed: u keeps its turn
    second = queue.pop()
    assert second is not None
    assert second.id == "u1"
    queue.done(second, placed=True)  # placed: v goes next
    third = queue.pop()
    assert third is not None
    assert third.id == "v0"
