"""The default scorer chain, summed by class, sums as the chain does."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st
from scheduler_builders import alloc, job, node, snapshot

from corral.core import GIB, Gpu, Node
from corral.scheduler.api import Config
from corral.scheduler.cycle import Cycle
from corral.scheduler.fit import Fit
from corral.scheduler.need import Need, need_of
from corral.scheduler.node_cap import NodeCap
from corral.scheduler.scorers import (
    DEFAULT_SCORERS,
    BestFit,
    Candidate,
    EndTogether,
    KeepWholeNodes,
    Locality,
    choose,
    default_total,
    fixed_weights,
    weighted,
)

CARDS = tuple(Gpu(i, "A100", 80 * GIB) for i in range(8))


@st.composite
def candidates(draw: st.DrawFn) -> list[Candidate]:
    out = []
    for idx in range(draw(st.integers(2, 4))):
        nc = NodeCap(idx, Node(f"n{idx}", gpus=CARDS, cpus=64), 0)
        used = draw(st.integers(0, 7))
        for g in range(used):
            nc.cards[g].free = 0
        nc.milli_free = sum(card.free for card in nc.cards)
        nc.whole_free = 8 - used
        cards = (used,) if used < 8 else ()
        fit = Fit(nc, cards, 1000, 80 * GIB, 1)
        gap = draw(st.none() | st.floats(0, 1))
        out.append(Candidate(fit, draw(st.integers(0, 2)), gap))
    return out


@settings(max_examples=200, deadline=None)
@given(
    candidates(),
    st.dictionaries(
        st.sampled_from(["best_fit", "locality", "keep_whole_nodes", "end_together"]),
        st.floats(0.01, 5),
    ),
)
def test_the_default_chain_by_class_picks_what_the_chain_picks(
    found: list[Candidate], weights: dict[str, float]
) -> None:
    chain = weighted(DEFAULT_SCORERS, weights)
    fixed = fixed_weights(chain)
    assert fixed is not None
    need = Need(gpus=1, cpus=1)
    assert choose(need, found, chain, fixed) is choose(need, found, chain)
    for candidate in found:
        total = 0.0
        for weight, scorer in chain:
            total += weight * scorer.score(need, candidate)
        got = default_total(need, candidate.fit, candidate.locality, candidate.end_gap, fixed)
        assert got == total  # the same float, not near it


def test_another_chain_is_summed_scorer_by_scorer() -> None:
    assert fixed_weights(weighted(DEFAULT_SCORERS, {"locality": 0})) is None  # dropped
    assert fixed_weights(weighted((EndTogether(), *DEFAULT_SCORERS[:3]), {})) is None
    assert fixed_weights(weighted(SUMMED, {})) is None  # the same scorers, other classes


@settings(max_examples=150, deadline=None)
@example(  # equal fill: the node whose work ends with this job's wins
    used=[6, 6],
    loaded=set(),
    ends={0: 100.0, 1: 1000.0},
    gpus=1,
    model=None,
    runtime=1000.0,
    limit=2,
    weights={},
)
@example(  # equal fill: the node with the model loaded wins
    used=[6, 6], loaded={1}, ends={}, gpus=1, model="m", runtime=None, limit=2, weights={}
)
@given(
    used=st.lists(st.sampled_from([0, 3, 3, 6, 8]), min_size=1, max_size=6),  # ties in fill
    loaded=st.sets(st.integers(0, 5)),
    ends=st.dictionaries(st.integers(0, 5), st.floats(1, 5000)),
    gpus=st.sampled_from([0.5, 1, 2, 4, 8]),
    model=st.none() | st.just("m"),
    runtime=st.none() | st.floats(1, 5000),
    limit=st.integers(1, 3),
    weights=st.dictionaries(
        st.sampled_from(["best_fit", "locality", "keep_whole_nodes", "end_together"]),
        st.floats(0.01, 5),
    ),
)
def test_a_cycle_scoring_fits_as_they_come_chooses_what_choose_chooses(
    used: list[int],
    loaded: set[int],
    ends: dict[int, float],
    gpus: float,
    model: str | None,
    runtime: float | None,
    limit: int,
    weights: dict[str, float],
) -> None:
    # Nodes of 8 cards with some in use, the model loaded on some, work ending at known
    # times on some: with the default chain a cycle scores each fit as it finds it (no
    # Candidate made); it finds the node a chain of the same scorers summed one by one
    # (``choose`` over every candidate) finds, ties to the earlier.
    nodes = []
    allocs = []
    for i, busy in enumerate(used):
        box = node(f"n{i}").gpus(8)
        nodes.append(box.models(loaded=("m",)) if i in loaded else box)
        if busy:
            allocs.append(alloc(f"a{i}", f"n{i}").cards(*range(busy)))
    snap = snapshot(nodes, [], allocs)
    expected = {f"a{i}": end for i, end in ends.items() if i < len(used) and used[i]}
    snap = replace(snap, expected_ends=expected)
    config = Config(scorer_weights=weights, candidates_per_tier=limit)
    need = need_of(job("w").gpus(gpus).build())
    streamed = Cycle(snap, config, now=0.0).find(need, model, runtime)
    summed = Cycle(snap, config, now=0.0, scorers=SUMMED).find(need, model, runtime)
    if summed is None:
        assert streamed is None
        return
    assert streamed is not None
    assert (streamed.node.idx, streamed.gpus) == (summed.node.idx, summed.gpus)


class _BestFit(BestFit):
    """The default scorers under other classes: a chain of them is summed scorer by scorer."""


class _Locality(Locality):
    pass


class _KeepWholeNodes(KeepWholeNodes):
    pass


class _EndTogether(EndTogether):
    pass


SUMMED = (_BestFit(), _Locality(), _KeepWholeNodes(), _EndTogether())
