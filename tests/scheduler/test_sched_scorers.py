"""The default scorer chain, summed by class, sums as the chain does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import GIB, Gpu, Node
from corral.scheduler.capacity import NodeCap
from corral.scheduler.fit import Fit
from corral.scheduler.need import Need
from corral.scheduler.scorers import (
    DEFAULT_SCORERS,
    Candidate,
    EndTogether,
    _default_total,
    choose,
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
        assert _default_total(need, candidate, fixed) == total  # the same float, not near it


def test_another_chain_is_summed_scorer_by_scorer() -> None:
    assert fixed_weights(weighted(DEFAULT_SCORERS, {"locality": 0})) is None  # dropped
    assert fixed_weights(weighted((EndTogether(), *DEFAULT_SCORERS[:3]), {})) is None
