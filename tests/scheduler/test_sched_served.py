"""Fair mixing across cycles: one job at a time, two users, the flood must not win every cycle."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.core import Job, Node, ResourceRequest
from corral.scheduler import Config, Plan, Scheduler, Snapshot, schedule
from corral.scheduler.served import ServiceLedger

Schedule = Callable[[Snapshot, Config, float], Plan]

ONE_SLOT = (Node("home-4090", cpus=1),)
CPU = ResourceRequest(cpus=1)


def run_one_at_a_time(
    jobs: list[Job], ledger: ServiceLedger | None, decide: Schedule = schedule
) -> list[str]:
    """Place one job per cycle on a one-slot node; each finishes before the next cycle."""
    queued, order, now = list(jobs), [], 100.0
    while queued:
        served = ledger.view(now) if ledger else {}
        plan = decide(Snapshot(ONE_SLOT, tuple(queued), served=served), Config(), now)
        [placement] = plan.placements
        [job_id] = placement.job_ids
        job = next(j for j in queued if j.id == job_id)
        if ledger:
            ledger.record(job.user, now)
        order.append(job.user)
        queued.remove(job)
        now += 5.0
    return order


def flood_then_one(n: int = 4) -> list[Job]:
    alice = [Job(f"a{i}", CPU, user="alice", submitted_at=float(i)) for i in range(n)]
    return [*alice, Job("b0", CPU, user="bob", submitted_at=float(n))]


def test_with_recent_service_a_single_job_is_not_stuck_behind_a_flood() -> None:
    order = run_one_at_a_time(flood_then_one(), ServiceLedger())
    assert order[:2] == ["alice", "bob"]  # bob waits one round, not four


def test_without_memory_the_oldest_job_wins_every_cycle() -> None:
    """Why the ledger exists: each cycle on its own cannot see who was just served."""
    assert run_one_at_a_time(flood_then_one(), None) == ["alice"] * 4 + ["bob"]


def test_two_floods_alternate() -> None:
    alice = [Job(f"a{i}", CPU, user="alice", submitted_at=float(i)) for i in range(3)]
    bob = [Job(f"b{i}", CPU, user="bob", submitted_at=10.0 + i) for i in range(3)]
    assert run_one_at_a_time(alice + bob, ServiceLedger()) == ["alice", "bob"] * 3


def test_service_decays_with_its_half_life_and_is_forgotten() -> None:
    ledger = ServiceLedger(half_life_s=10.0)
    ledger.record("alice", 0.0)
    ledger.record("alice", 0.0)
    assert ledger.view(10.0) == {"alice": pytest.approx(1.0)}
    assert ledger.view(1000.0) == {}


def test_a_view_drops_only_the_users_whose_service_faded_and_keeps_the_order() -> None:
    ledger = ServiceLedger(half_life_s=10.0)
    for user, at in (("carol", 60.0), ("alice", 0.0), ("bob", 65.0)):
        ledger.record(user, at)
    view = ledger.view(70.0)  # alice's 1 has decayed to 2**-7, under FORGET_BELOW
    assert list(view) == ["carol", "bob"]  # alice's dropped, the rest in their order
    assert view == {"carol": pytest.approx(0.5), "bob": pytest.approx(2**-0.5)}
    ledger.record("alice", 70.0)  # forgotten, so served afresh: nothing left from before
    assert ledger.view(70.0)["alice"] == 1.0


def test_a_ledger_needs_a_positive_half_life() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        ServiceLedger(half_life_s=0)


def test_a_kept_scheduler_takes_each_cycle_s_service() -> None:
    """The server's loop keeps its scheduler between cycles and gives it the ledger's view
    before each: a flood's owner is served first, then the newcomer."""
    sched = Scheduler(ONE_SLOT)
    for job in flood_then_one():
        sched.submit(job)
    ledger, order, now = ServiceLedger(), [], 100.0
    while sched.queue:
        sched.served = ledger.view(now)
        [placement] = sched.schedule(now).placements
        job = sched.withdraw(placement.job_ids[0])
        ledger.record(job.user, now)
        order.append(job.user)
        now += 5.0
    assert order == run_one_at_a_time(flood_then_one(), ServiceLedger())
    assert order[:2] == ["alice", "bob"]
