"""The working copy: reserve/release keep the index right; rollback is exact."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from scheduler_builders import alloc, job, node, snapshot

from corral.core import GIB, Gpu, Node
from corral.scheduler.api import Config
from corral.scheduler.bits import Bucket
from corral.scheduler.capacity import Capacity, NodeCap
from corral.scheduler.cluster import Cluster
from corral.scheduler.cycle import Cycle
from corral.scheduler.fit import Source, fit_on, search
from corral.scheduler.need import Need, need_of
from corral.scheduler.scorers import Candidate

NODES = tuple(
    Node(name=f"n{i}", gpus=tuple(Gpu(g, "A100", 24 * GIB) for g in range(4)), cpus=8)
    for i in range(3)
)
# n1 reports two NUMA nodes (cards 0-1 and 2-3, 4 CPUs each): its CPUs are drawn per node
NODES = (
    NODES[0],
    Node(
        name="n1",
        gpus=tuple(Gpu(g, "A100", 24 * GIB, numa=g // 2) for g in range(4)),
        cpus=8,
        numa_cpus=((0, 4.0), (1, 4.0)),
    ),
    NODES[2],
)


def state(cap: Capacity) -> list[tuple[object, ...]]:
    """Everything a rollback must restore, index membership (and its order) included."""
    out: list[tuple[object, ...]] = []
    for nc in cap.nodes:
        out.append(
            (
                tuple(card.free for card in nc.cards),
                tuple(card.vram_free for card in nc.cards),
                nc.cpus_free,
                tuple(nc.numa_free),
                nc.hidden,
                tuple(lv for lv, b in enumerate(cap.everywhere.whole) if nc in b),
                tuple(lv for lv, b in enumerate(cap.everywhere.partial) if nc in b),
                tuple(lv for lv, b in enumerate(cap.everywhere.cpu) if nc in b),
            )
        )
    return out


def consistent(cap: Capacity) -> None:
    """Each node sits in exactly the buckets its free capacity says, buckets in node order."""
    index = cap.everywhere
    for nc in cap.nodes:
        assert nc.whole_free == sum(1 for card in nc.cards if card.free == 1000)
        assert nc.milli_free == sum(card.free for card in nc.cards)
        listed = not nc.hidden
        for level, bucket in enumerate(index.whole):
            assert (nc in bucket) == (listed and level == nc.whole_free > 0)
        for level, bucket in enumerate(index.partial):
            assert (nc in bucket) == (listed and level == nc.partial_level)
        for level, bucket in enumerate(index.cpu):
            has_cpu = listed and nc.cpus_free > 0
            assert (nc in bucket) == (has_cpu and level == (nc.whole_free > 0))
    for bucket in (*index.whole, *index.partial, *index.cpu):
        assert [nc.idx for nc in bucket] == sorted(nc.idx for nc in bucket)


Held = tuple[NodeCap, tuple[int, ...], int, int, int]

op = st.tuples(
    st.sampled_from(
        ("whole", "whole", "pair", "share", "release", "hide", "checkpoint", "rollback")
    ),
    st.integers(0, 2),
    st.integers(0, 3),
    st.sampled_from((250, 500)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=40))
@example(
    [("checkpoint", 0, 0, 0)]
    + [("whole", 0, card, 0) for card in range(4)]
    + [("rollback", 0, 0, 0)]
)
@example(
    [
        ("hide", 1, 0, 0),
        ("whole", 1, 2, 0),
        ("checkpoint", 0, 0, 0),
        ("hide", 2, 0, 0),
        ("share", 2, 1, 250),
        ("rollback", 0, 0, 0),
    ]
)
def test_rollback_restores_the_exact_state_and_the_index_stays_consistent(
    ops: list[tuple[str, int, int, int]],
) -> None:
    cap = Capacity(NODES, [0, 0, 0])
    marks: list[tuple[tuple[int, int], list[tuple[object, ...]], list[Held]]] = []
    held: list[Held] = []
    for kind, n, card, milli in ops:
        nc = cap.nodes[n]
        if kind == "whole" and nc.cards[card].free == 1000 and nc.cpus_free >= 1:
            held.append((nc, (card,), 1000, 0, 1))
            cap.reserve(*held[-1])
        elif kind == "pair" and all(nc.cards[c].free == 1000 for c in (card, (card + 1) % 4)):
            held.append((nc, (card, (card + 1) % 4), 1000, 0, 3))  # across NUMA nodes at 1, 3
            cap.reserve(*held[-1])
        elif kind == "share" and nc.cards[card].free >= milli:
            held.append((nc, (card,), milli, milli * 24 * GIB // 1000, 0))
            cap.reserve(*held[-1])
        elif kind == "release" and held:
            cap.release(*held.pop())
        elif kind == "hide":
            cap.hide(nc)
        elif kind == "checkpoint":
            marks.append((cap.checkpoint(), state(cap), list(held)))
        elif kind == "rollback" and marks:
            mark, before, held = marks.pop()
            cap.rollback(mark)
            assert state(cap) == before
        consistent(cap)


def test_a_need_that_failed_is_cached_until_capacity_is_given_back() -> None:
    cap = Capacity(NODES[:1], [0])
    nc = cap.nodes[0]
    generation = cap.generation
    cap.reserve(nc, (0, 1, 2, 3), 1000, 0, 0)
    assert cap.generation == generation  # taking capacity never revives a failed fit
    cap.release(nc, (0,), 1000, 0, 0)
    assert cap.generation != generation
    assert Need(gpus=1).nominal_milli() == 1000


def test_a_rollback_also_undoes_cache_writes_made_during_the_what_if() -> None:
    from corral.scheduler import Config, Snapshot
    from corral.scheduler.cycle import Cycle

    cycle = Cycle(Snapshot(nodes=NODES), Config(), now=0.0)
    memo = cycle.memo()
    memo.put("kept", 1)
    mark = cycle.checkpoint()
    memo.put("kept", 2)
    memo.put("new", 3)
    cycle.cap.reserve(cycle.cap.nodes[0], (0,), 1000, 0, 1)
    cycle.rollback(mark)
    assert memo.get("kept") == 1
    assert memo.get("new") is None
    assert cycle.cap.nodes[0].cards[0].free == 1000


def test_a_rollback_also_undoes_team_usage_the_ledger_took_during_the_what_if() -> None:
    # The ledger keeps each team's usage in an entry of its own (``quota.TeamBudget``), not in a
    # memo's dict: its changes go to the cycle's log all the same, and roll back with it.
    from corral.core.model import Team
    from corral.scheduler import Config, Snapshot
    from corral.scheduler.quota import Ledger

    cycle = Cycle(Snapshot(nodes=NODES), Config(), now=0.0)
    teams = (Team("a", quota_gpus=1, borrow_limit_gpus=1),)
    ledger = Ledger.of_usage(teams, {"a": 500, "stranger": 250}, cycle.memo())
    page = ledger.budget("a")
    ledger.add("a", 250)
    mark = cycle.checkpoint()
    ledger.add("a", 1000)
    ledger.add("b", 300)  # a team the snapshot does not name: no quota, no limit
    assert (ledger.used("a"), ledger.used("b"), page.usage) == (1750, 300, 1750)
    assert not ledger.within_limit("a", 300)
    assert ledger.within_limit("b", 10**6)
    assert not ledger.within_quota("b", 1)
    cycle.rollback(mark)
    assert (ledger.used("a"), ledger.used("b"), ledger.used("stranger")) == (750, 0, 250)
    assert ledger.within_quota("a", 250)
    assert not ledger.within_quota("a", 251)
    assert ledger.within_limit("a", 1250)
    assert not ledger.within_limit("a", 1251)
    assert ledger.bound("a", False) == 1000
    assert ledger.bound("a", True) == 2000
    assert ledger.bound("b", True) == float("inf")
    assert ledger.quota("b") == 0


WIDE = tuple(Node(name=f"w{i}", gpus=(), cpus=1) for i in range(130))  # three words of bits


@given(
    st.sets(st.integers(0, len(WIDE) - 1)),
    st.sets(st.integers(0, len(WIDE) - 1)),
    st.integers(0, len(WIDE) + 70),
)
@example(set(), set(), 0)
@example({31, 32, 59, 60, 119, 120, 129}, {32}, 60)  # bits past 31 of a word (machine ints)
def test_a_bucket_walked_by_next_at_gives_its_nodes_in_order_from_any_index(
    added: set[int], removed: set[int], start: int
) -> None:
    cap = Capacity(WIDE, [0] * len(WIDE))
    bucket = Bucket(cap.nodes)
    for i in sorted(added):
        bucket.add(cap.nodes[i])
    for i in sorted(removed):
        bucket.remove(cap.nodes[i])
    members = added - removed
    assert bucket.size == len(members)
    assert all((cap.nodes[i] in bucket) == (i in members) for i in range(len(WIDE)))
    after = sorted(i for i in members if i >= start)
    assert bucket.next_at(start) == (after[0] if after else -1)
    walked, i = [], bucket.next_at(0)
    while i >= 0:
        walked.append(i)
        i = bucket.next_at(i + 1)
    assert walked == sorted(members) == [nc.idx for nc in bucket]


MIXED = tuple(
    Node(name=f"m{i}", gpus=tuple(Gpu(g, "A100", 24 * GIB) for g in range(4)), cpus=8)
    for i in range(6)
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.sampled_from((250, 1000)))),
    st.sampled_from(
        (Need(gpus=1, cpus=1), Need(gpus=2), Need(gpus=3, cpus=4), Need(milli=250), Need(cpus=2))
    ),
    st.integers(1, 8),
    st.booleans(),
)
def test_a_search_of_one_tier_lists_each_node_once_with_or_without_a_seen_set(
    taken: list[tuple[int, int, int]], need: Need, limit: int, by_class: bool
) -> None:
    # ``search`` keeps no set for a whole-card search of the caller's only tier: its sources
    # hold disjoint nodes and an index holds a node in one bucket of wholly free cards. It
    # must find what it finds with an empty set, and never a node twice.
    cap = Capacity(MIXED, [0, 0, 1, 1, 2, 2])
    for n, card, milli in taken:
        nc = cap.nodes[n]
        if nc.cards[card].free >= milli and nc.cpus_free >= 1:
            cap.reserve(nc, (card,), milli, milli * 24 * GIB // 1000, 1)
    sources = (
        [Source(cap.by_class[c]) for c in sorted(cap.by_class)]
        if by_class
        else [Source(cap.everywhere)]
    )
    without = search(need, sources, limit, None)
    with_set = search(need, sources, limit, set())
    assert [(f.node.idx, f.gpus) for f in without] == [(f.node.idx, f.gpus) for f in with_set]
    assert len({f.node.idx for f in without}) == len(without)


def test_a_node_in_two_tiers_is_a_candidate_once() -> None:
    # Nodes holding the model are searched first (their tier), then every node: the ones
    # found in the first tier must not come again from the second. A scorer sees each
    # candidate once.
    nodes = [node(f"n{i}").gpus(2).models(loaded=("m",) if i < 2 else ()) for i in range(4)]
    snap = snapshot(nodes, [job("j").gpus(1).set(model="m")])
    rated = Rated()
    cycle = Cycle(Cluster.of(snap), Config(candidates_per_tier=8), 0.0, scorers=(rated,))
    assert cycle.find(Need(gpus=1), "m") is not None
    assert sorted(rated.nodes) == [0, 1, 2, 3]


class Rated:
    """A scorer that notes the node of each candidate it rates (and prefers none)."""

    name = "rated"
    weight = 1.0

    def __init__(self) -> None:
        self.nodes: list[int] = []

    def score(self, need: Need, candidate: Candidate) -> float:
        self.nodes.append(candidate.fit.node.idx)
        return 0.0


def test_a_whole_node_takes_every_card_in_order_and_one_busy_card_refuses_it() -> None:
    # ``fit_on`` gives a job of a whole node every card, (0, ..., 7), without looking for
    # them one by one; one card busy and it does not fit, while 4 cards take the first free.
    snap = snapshot([node("a").gpus(8), node("b").gpus(8)], [], [alloc("x", "b").cards(3)])
    a, b = Cluster.of(snap).cap.nodes
    whole = need_of(job("w").gpus(8).build())
    fit = fit_on(a, whole)
    assert fit is not None
    assert fit.gpus == (0, 1, 2, 3, 4, 5, 6, 7)
    assert fit_on(b, whole) is None
    four = fit_on(b, need_of(job("f").gpus(4).build()))
    assert four is not None
    assert four.gpus == (0, 1, 2, 4)
