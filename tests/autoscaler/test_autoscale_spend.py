"""The pure autoscaler's money and in-flight rules: launches in flight count, spend caps are
never passed, pools are chosen by price per GPU, and a launch says what it is for."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_autoscale_policy import A100, CFG, G4090, NOW, decide, gpu_job, joined, launched, waiting

from corral.autoscaler import Member, Pool
from corral.autoscaler.ledger import Launched, fleet
from corral.core.model import Job
from corral.core.resources import GIB, ResourceRequest

BIG4090 = Pool("4090x4", gpus=4, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=32,
               max_nodes=10, cost_per_hour=1.6)  # fmt: skip


def asked(name: str, pool: Pool = G4090, at: float = NOW - 20) -> Launched:
    return Launched(name, pool.name, "", f"req-{name}", at, pool.cost_per_hour, sent=True)


# -- launches in flight ------------------------------------------------------------------------


def test_a_launch_the_provider_does_not_list_yet_takes_the_waiting_job() -> None:
    members = fleet([], [asked("4090-a")])  # asked for 20 s ago, not listed, not joined
    reply = decide(pending=waiting(gpu_job("a")), members=members)
    assert reply.launches == ()
    assert reply.unmet == ()


def test_launches_in_flight_count_against_max_nodes() -> None:
    pool = replace(G4090, max_nodes=3)
    members = fleet([], [asked(f"4090-{i}") for i in range(3)])
    jobs = [gpu_job(f"j{i}") for i in range(6)]
    reply = decide(pools=(pool,), pending=waiting(*jobs), members=members)
    assert reply.launches == ()  # three booting: the pool is full until one ends
    assert "max_nodes" in reply.unmet[0].reason


def test_a_launch_never_listed_is_removed_after_the_boot_timeout_and_backs_the_pool_off() -> None:
    members = fleet([], [asked("4090-a", at=NOW - CFG.boot_timeout_s - 1)])
    reply = decide(pending=waiting(gpu_job("a")), members=members)
    assert [(r.name, r.code) for r in reply.remove] == [("4090-a", "not_joined")]
    assert "4090" in reply.backoff
    assert launched(reply) == {"a100": 1}  # the next cheapest pool that fits takes the work


def test_a_listed_machine_is_timed_from_when_it_was_asked_for() -> None:
    listed = [Member("4090-a", "4090", NOW - 5)]  # the provider says it started 5 s ago
    (member,) = fleet(listed, [asked("4090-a", at=NOW - 950)])
    assert member.launched_at == NOW - 950


# -- spend caps --------------------------------------------------------------------------------


def test_the_overall_cap_stops_launches_that_would_pass_it() -> None:
    config = replace(CFG, max_spend_per_hour=1.2)  # room for two 4090s at 0.5 $/h
    reply = decide(pending=waiting(*[gpu_job(f"j{i}") for i in range(5)]), config=config)
    assert launched(reply) == {"4090": 2}
    assert "max_spend_per_hour" in reply.unmet[0].reason


def test_machines_in_flight_count_against_the_overall_cap() -> None:
    config = replace(CFG, max_spend_per_hour=1.0)
    members = fleet([], [asked("4090-a"), asked("4090-b")])
    jobs = [gpu_job(f"j{i}") for i in range(4)]
    assert launched(decide(pending=waiting(*jobs), members=members, config=config)) == {}


def test_a_pool_cap_sends_work_on_to_the_next_pool() -> None:
    capped = replace(G4090, max_spend_per_hour=1.0)  # two machines' worth
    reply = decide(pools=(A100, capped), pending=waiting(*[gpu_job(f"j{i}") for i in range(3)]))
    assert launched(reply) == {"4090": 2, "a100": 1}


def test_a_cap_holds_even_against_min_nodes() -> None:
    warm = replace(G4090, min_nodes=4)
    reply = decide(pools=(warm,), config=replace(CFG, max_spend_per_hour=1.0))
    assert launched(reply) == {"4090": 2}


@pytest.mark.parametrize("cap", [0.0, 0.49])
def test_a_cap_below_one_machine_launches_none(cap: float) -> None:
    reply = decide(pending=waiting(gpu_job("a")), config=replace(CFG, max_spend_per_hour=cap))
    assert reply.launches == ()


# -- price per GPU -----------------------------------------------------------------------------


def test_the_pool_cheapest_per_gpu_is_chosen() -> None:
    # 0.5 $/h for one GPU against 1.6 $/h for four (0.4 per GPU): four jobs fill the big one.
    reply = decide(pools=(G4090, BIG4090), pending=waiting(*[gpu_job(f"j{i}") for i in range(4)]))
    assert launched(reply) == {"4090x4": 1}


def test_a_launch_says_how_much_work_it_is_for_and_how_long_it_waited() -> None:
    reply = decide(pending=waiting(gpu_job("a"), gpu_job("b"), since=NOW - 45))
    assert [(x.pool, x.count, x.reason) for x in reply.launches] == [
        ("4090", 2, "2 jobs waited 45 s")
    ]


# -- a fixed set -------------------------------------------------------------------------------

HOME = Pool("home", gpus=1, gpu_model="RTX 4090", vram_bytes=24 * GIB, cpus=8, min_nodes=2,
            max_nodes=2, fixed=True)  # fmt: skip


def test_an_idle_machine_of_a_fixed_set_takes_work_before_a_launch() -> None:
    members = (Member("box-1", "home", 0.0), Member("box-2", "home", 0.0))
    nodes = {"box-1": joined(HOME, "box-1")}  # box-2 is off: never replaced, never removed
    reply = decide(pools=(G4090, HOME), members=members, nodes=nodes,
                   pending=waiting(gpu_job("a")), idle_since={"box-1": 0.0})  # fmt: skip
    assert reply.idle


def test_a_fixed_set_is_never_drained_removed_or_topped_up() -> None:
    members = (Member("box-1", "home", 0.0), Member("box-2", "home", 0.0))
    nodes = {"box-1": joined(HOME, "box-1")}
    reply = decide(pools=(HOME,), members=members, nodes=nodes, idle_since={"box-1": 0.0})
    assert reply.idle


def test_work_without_gpus_goes_to_the_cheapest_machine_not_the_cheapest_gpu() -> None:
    cpu_job = Job("c", resources=ResourceRequest(cpus=2))
    reply = decide(pools=(BIG4090, G4090), pending=waiting(cpu_job))
    assert launched(reply) == {"4090": 1}  # 0.5 $/h beats 1.6 $/h, though 0.4 per GPU


# -- machines on their way out ------------------------------------------------------------------


def test_a_terminated_machine_still_listed_counts_but_takes_no_work_and_is_not_removed() -> None:
    pool = replace(G4090, max_nodes=1)
    members = (Member("4090-old", "4090", NOW - 2000),)  # no node: it was terminated
    reply = decide(pools=(pool,), members=members, pending=waiting(gpu_job("a")),
                   leaving=frozenset({"4090-old"}))  # fmt: skip
    assert reply.remove == ()  # not "did not join": it was removed already
    assert reply.backoff == {}
    assert reply.launches == ()  # it still costs: the pool is full until it is gone
    assert "max_nodes" in reply.unmet[0].reason


def test_a_terminated_machine_still_listed_counts_against_the_overall_cap() -> None:
    members = (Member("4090-old", "4090", NOW - 2000),)
    reply = decide(members=members, pending=waiting(gpu_job("a")),
                   leaving=frozenset({"4090-old"}),
                   config=replace(CFG, max_spend_per_hour=0.9))  # fmt: skip
    assert reply.launches == ()
