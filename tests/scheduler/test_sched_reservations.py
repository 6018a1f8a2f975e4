"""Backfill reservations: the big job at the head of its class is not starved by small ones.

The cluster of most cases: n1 has 3 of its 4 cards busy until t=500, n2 has 1 of
4 busy until t=1000. A 4-GPU job fits nowhere now; n1 is where it should fit
first (at 500), so n1 is reserved for it and small jobs go elsewhere, unless
they end before 500 (backfill).
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_builders import alloc, job, node, snapshot

from corral.scheduler import Config, Plan, ReasonCode, Scheduler, Snapshot, schedule
from corral.scheduler.cluster import Cluster
from corral.scheduler.cycle import Cycle
from corral.scheduler.need import need_of
from corral.scheduler.reservation import CANDIDATES, Reservations

ON = Config(reserve_min_gpus=4)
OFF = Config(reserve_min_gpus=None)


def cluster(*queued: object) -> Snapshot:
    snap = snapshot(
        [node("n1").gpus(4), node("n2").gpus(4)],
        list(queued),  # type: ignore[arg-type]
        [alloc("busy1", "n1").cards(0, 1, 2), alloc("busy2", "n2").cards(0)],
    )
    return replace(snap, expected_ends={"busy1": 500.0, "busy2": 1000.0})


def big(job_id: str = "big", at: float = 0) -> object:
    return job(job_id).gpus(4).set(priority="batch", submitted_at=at)


def small(job_id: str, at: float, estimate: float | None = 2000.0) -> object:
    return job(job_id).gpus(1).set(priority="batch", submitted_at=at, estimated_runtime_s=estimate)


def where(plan: Plan) -> dict[str, str]:
    return {j: p.node for p in plan.placements for j in p.job_ids}


def test_the_node_that_frees_first_is_kept_for_the_big_job_at_the_head_of_its_class() -> None:
    smalls = [small(f"s{i}", at=10 + i) for i in range(4)]
    plan = schedule(cluster(big(), *smalls), ON, now=0.0)
    assert set(where(plan).values()) == {"n2"}  # nothing small lands on n1
    assert len(plan.placements) == 3  # n2's three free cards
    reasons = {u.job_id: u.reasons for u in plan.unplaced}
    held = [r for r in reasons["big"] if r.code is ReasonCode.HOLDS_RESERVATION]
    assert held
    assert "n1" in held[0].message
    assert "~500s" in held[0].message
    reserved = [r for r in reasons["s3"] if r.code is ReasonCode.RESERVED]
    assert reserved
    assert reserved[0].nodes == 1


def test_without_reservations_small_jobs_take_the_hole_the_big_job_needs() -> None:
    smalls = [small(f"s{i}", at=10 + i) for i in range(4)]
    plan = schedule(cluster(big(), *smalls), OFF, now=0.0)
    assert sorted(where(plan).values()) == ["n1", "n2", "n2", "n2"]


FILLERS = [small(f"f{i}", at=1 + i) for i in range(3)]  # n2's free cards go to these


def test_a_small_job_that_ends_before_the_reservation_backfills_into_it() -> None:
    quick = small("quick", at=10, estimate=300.0)  # ends at 300 < 500
    slow = small("slow", at=11, estimate=900.0)  # would delay the big job
    plan = schedule(cluster(big(), *FILLERS, quick, slow), ON, now=0.0)
    assert where(plan)["quick"] == "n1"
    assert "slow" not in where(plan)


def test_jobs_without_an_estimate_never_backfill() -> None:
    unknown = small("unknown", at=10, estimate=None)
    plan = schedule(cluster(big(), *FILLERS, unknown), ON, now=0.0)
    assert "unknown" not in where(plan)


def test_the_oldest_big_job_of_a_class_goes_before_its_smaller_jobs() -> None:
    older_small = small("older", at=0)
    newer_big = big("big", at=5)
    snap = snapshot([node("n").gpus(4)], [older_small, newer_big])  # type: ignore[list-item]
    assert where(schedule(snap, ON, now=10.0)) == {"big": "n"}
    assert where(schedule(snap, OFF, now=10.0)) == {"older": "n"}


def test_a_higher_class_is_not_held_back_by_a_lower_class_reservation() -> None:
    urgent = job("urgent").gpus(1).set(priority="paid", submitted_at=20)
    plan = schedule(cluster(big(), urgent), ON, now=0.0)
    assert "urgent" in where(plan)  # paid is decided before batch reserves anything


def test_the_reservation_stays_on_the_same_node_cycle_after_cycle() -> None:
    # Without moves: from t=60 on, moving busy1 to n2's free cards would let the big job
    # run at once (test_sched_consolidation.py); here it waits for its reservation.
    still = replace(ON, consolidation_moves=0)
    sched = Scheduler.from_snapshot(
        cluster(big(), *[small(f"s{i}", 10 + i) for i in range(6)]), still
    )
    for now in (0.0, 100.0, 200.0):
        plan = sched.schedule(now)
        assert "n1" not in where(plan).values()
        reasons = next(u.reasons for u in plan.unplaced if u.job_id == "big")
        held = next(r for r in reasons if r.code is ReasonCode.HOLDS_RESERVATION)
        assert held.message.startswith("nodes reserved for it: n1 ")
    sched.end("busy1")  # n1's work ends: the big job starts there
    assert where(sched.schedule(500.0))["big"] == "n1"


def test_a_gang_reserves_one_node_per_replica() -> None:
    gang = job("gang").gpus(4).set(priority="batch", replicas=2, submitted_at=0)
    plan = schedule(cluster(gang, small("s", at=10)), ON, now=0.0)
    held = [r for u in plan.unplaced if u.job_id == "gang" for r in u.reasons]
    reservation = next(r for r in held if r.code is ReasonCode.HOLDS_RESERVATION)
    assert reservation.nodes == 2
    assert "s" not in where(plan)  # both nodes are held: the small job waits


_ENDS = st.sampled_from([0.0, -0.0, 1.5, 2.0, 7.25, 1e9])  # few: many ties, -0.0 == 0.0


@settings(max_examples=150, deadline=None)
@given(
    ends=st.lists(st.one_of(st.just("free"), st.none(), _ENDS, _ENDS), min_size=20, max_size=40),
    booked=st.lists(st.tuples(st.integers(0, 39), _ENDS), max_size=8),
    hidden=st.sets(st.integers(0, 39), max_size=6),
    replicas=st.just(CANDIDATES) | st.integers(1, CANDIDATES),  # all of the candidates, or some
)
def test_a_reservation_holds_the_nodes_that_free_up_first(
    ends: list[str | float | None],
    booked: list[tuple[int, float]],
    hidden: set[int],
    replicas: int,
) -> None:
    # One-card nodes, each free, or busy with work whose end is known or not; this cycle
    # books later ends on some (its own placements) and has hidden others (reserved ahead).
    # A job of ``replicas`` one-card replicas reserves the nodes where it fits soonest, by
    # (when, free before busy, index): a free node now, a busy one when its work should end
    # (its booking, if later; never: unknown). It starts when the last of them frees.
    size = len(ends)
    nodes = [node(f"n{i:02}").gpus(1) for i in range(size)]
    busy = [i for i, end in enumerate(ends) if end != "free"]
    allocs = [alloc(f"a{i}", f"n{i:02}").cards(0) for i in busy]
    known = {f"a{i}": end for i, end in enumerate(ends) if isinstance(end, float)}
    cycle = Cycle(replace(snapshot(nodes, [], allocs), expected_ends=known), ON, now=0.0)
    for idx, end in booked:
        if idx < size:
            cycle.book(idx, end)
    for idx in hidden:
        if idx < size:
            cycle.cap.hide(cycle.cap.nodes[idx])
    reservations = Reservations(cycle, lambda name: ())  # no work listed: the nodes' ends
    reservations.reserve("big", need_of(job("big").gpus(1).build()), replicas)

    def fits_at(idx: int) -> tuple[float, int, int]:
        if ends[idx] == "free":
            return (0.0, -1, idx)
        end = cycle.expected_end(idx)
        return (math.inf if end is None else max(end, 0.0), 0, idx)

    soonest = sorted(fits_at(idx) for idx in range(size) if idx not in hidden)[:replicas]
    if len(soonest) < replicas:
        assert reservations.held == []
        return
    (held,) = reservations.held
    assert [nc.idx for nc in held.nodes] == [idx for *_, idx in soonest]
    assert held.start == max(when for when, *_ in soonest)


@settings(max_examples=60, deadline=None)
@given(
    ends=st.dictionaries(st.integers(0, 5), st.sampled_from([0.0, 1.5, 7.25, 1e9])),
    booked=st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.5, 3.0, 2e9])), max_size=6),
)
def test_a_nodes_expected_end_is_its_booking_else_the_end_it_started_with(
    ends: dict[int, float], booked: list[tuple[int, float]]
) -> None:
    # ``expected_end`` reads the cycle's start by index (a list the kept scheduler keeps in
    # step with its map, or one made from the map): both give each node's end, and a
    # booking later than it wins until rolled back.
    cluster = Cluster.of(snapshot([node(f"n{i}").gpus(1) for i in range(6)]))
    end_at: list[float | None] = [ends.get(i) for i in range(6)]
    made, kept = (Cycle(cluster, ON, 0.0, ends=ends, end_at=at) for at in (None, end_at))
    mark = made.checkpoint()
    want = dict(ends)
    for idx, end in booked:
        made.book(idx, end)
        want[idx] = max(end, want.get(idx, end))
    assert [made.expected_end(i) for i in range(6)] == [want.get(i) for i in range(6)]
    assert [kept.expected_end(i) for i in range(6)] == [ends.get(i) for i in range(6)]
    made.rollback(mark)
    assert [made.expected_end(i) for i in range(6)] == [ends.get(i) for i in range(6)]


@settings(max_examples=120, deadline=None)
@given(
    big_cards=st.integers(0, 8),
    busy=st.lists(
        st.tuples(st.sets(st.integers(0, 7), min_size=1, max_size=3), st.none() | _ENDS),
        max_size=6,
    ),
    gpus=st.integers(1, 8),
    floor=st.sampled_from([0, 48]),
    booked=st.none() | _ENDS,
)
def test_when_a_need_fits_on_a_node_is_its_nth_soonest_usable_card(
    big_cards: int,
    busy: list[tuple[set[int], float | None]],
    gpus: int,
    floor: int,
    booked: float | None,
) -> None:
    # A node of 8 cards, the first ``big_cards`` of 80 GiB and the rest of 40; allocations
    # on some cards with known ends or none; a need of ``gpus`` cards with a VRAM floor or
    # none (every card usable: the path that makes no list of them). Its time is the n-th
    # soonest of its usable cards' times: now for a free card, else the latest end of the
    # work on it (inf: unknown), else (a card this cycle took) the node's expected end.
    box = node("n").gpus(big_cards) if big_cards else node("n")
    box = box.gpus(8 - big_cards, vram_gib=40) if big_cards < 8 else box
    allocs = [alloc(f"a{i}", "n").cards(*sorted(cards)) for i, (cards, _) in enumerate(busy)]
    ends = {f"a{i}": end for i, (_, end) in enumerate(busy) if end is not None}
    snap = replace(snapshot([box], [], allocs), expected_ends=ends)
    cycle = Cycle(snap, ON, now=1.0)
    nc = cycle.cap.nodes[0]
    if booked is not None:  # a card this cycle placed work on, until ``booked``
        free = [i for i, card in enumerate(nc.cards) if card.free == 1000]
        if free:
            cycle.cap.reserve(nc, (free[0],), 1000, 0, 0)
            cycle.book(0, booked)
    work = [(a, ends.get(a.id)) for a in snap.allocations]
    reservations = Reservations(cycle, lambda name: work)
    need = need_of(job("want").gpus(gpus).vram(floor).build())
    usable = [i for i in range(8) if nc.gpu_vram[i] >= need.vram]
    times: dict[int, float] = {i: 1.0 for i in usable if nc.cards[i].free == 1000}
    for a, end in work:
        for pos in a.gpu_indices:
            if pos in usable and nc.cards[pos].free < 1000:
                when = math.inf if end is None else max(end, 1.0)
                times[pos] = max(times.get(pos, -math.inf), when)
    node_end = cycle.expected_end(0)
    rest = math.inf if node_end is None else max(node_end, 1.0)
    every = sorted(times.get(i, rest) for i in usable)
    if len(usable) < gpus:
        want = math.inf
    elif sum(nc.cards[i].free == 1000 for i in usable) >= gpus:
        want = 1.0
    else:
        want = every[gpus - 1]
    reservations.reserve("want", need, 1)  # the node is held from then (inf: if ever)
    held = reservations.held
    assert (held[0].start if held else math.inf) == want
