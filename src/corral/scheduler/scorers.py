"""Scorers: among the nodes where a job fits, which is best (STYLE.md habit 5).

A scorer is a tiny protocol: a ``name``, a default ``weight`` and
``score(need, candidate)`` returning a number in [0, 1] (or [-1, 0] for a
penalty). The pipeline sums ``weight x score`` over the chain and takes the
highest, ties going to the earlier candidate (the tighter fit), so the result
is deterministic. ``Config.scorer_weights`` overrides weights by name (0
switches a scorer off).

Default weights say what matters more: a model already loaded in VRAM saves
a model swap (tens of seconds of a card), which beats a slightly tighter
pack; a model on disk saves a download; breaking a whole free node is a
cost, because big jobs and gangs need whole nodes; with run-time estimates,
work that ends together on a node frees the whole node together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from corral.core.compiled import mypyc_attr
from corral.core.resources import cpu_milli
from corral.scheduler.fit import Fit
from corral.scheduler.need import Need
from corral.scheduler.node_cap import LOADED


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class Candidate:
    """A fit and what scorers may want to know about its node; treat it as immutable."""

    __slots__ = ("end_gap", "fit", "locality")

    def __init__(self, fit: Fit, locality: int, end_gap: float | None = None) -> None:
        self.fit = fit
        self.locality = locality  # LOADED, ON_DISK or ABSENT for the job's model
        # 0: ends with the node's other work; 1: far apart; None: unknown
        self.end_gap = end_gap

    def __repr__(self) -> str:
        return f"Candidate({self.fit!r}, {self.locality}, {self.end_gap})"


class Scorer(Protocol):
    """Rates one candidate; higher is better."""

    name: str
    weight: float

    def score(self, need: Need, candidate: Candidate) -> float: ...


class BestFit:
    """Bin packing: the fuller the node after placement, the better."""

    name = "best_fit"
    weight = 1.0

    def score(self, need: Need, candidate: Candidate) -> float:
        return best_fit(need, candidate.fit)


class Locality:
    """Prefer a node whose backend has the model loaded, then one that has it on disk."""

    name = "locality"
    weight = 2.0

    def score(self, need: Need, candidate: Candidate) -> float:
        return candidate.locality / LOADED


class KeepWholeNodes:
    """Anti-fragmentation: a penalty for starting on a wholly free node with a small job."""

    name = "keep_whole_nodes"
    weight = 0.5

    def score(self, need: Need, candidate: Candidate) -> float:
        return keep_whole(need, candidate.fit)


class EndTogether:
    """With run-time estimates: prefer nodes whose work ends when this job would.

    A node whose allocations all end at about the same time becomes a whole
    free node at once, instead of staying fragmented by one straggler.
    """

    name = "end_together"
    weight = 0.3

    def score(self, need: Need, candidate: Candidate) -> float:
        return end_together(candidate.end_gap)


def best_fit(need: Need, fit: Fit) -> float:
    """``BestFit``'s score of ``fit``."""
    nc = fit.node
    if need.cpu_only:
        total = cpu_milli(nc.node.cpus) or 1
        return 1.0 - (nc.cpus_free - fit.cpus) / total
    total_cards = nc.gpu_count or 1
    free_after = nc.milli_free - fit.total_milli
    return 1.0 - free_after / (total_cards * 1000)


def keep_whole(need: Need, fit: Fit) -> float:
    """``KeepWholeNodes``' score of ``fit``."""
    nc = fit.node
    if need.cpu_only or nc.gpu_count == 0 or nc.whole_free < nc.gpu_count:
        return 0.0
    return 0.0 if len(fit.gpus) == nc.gpu_count else -1.0


def end_together(end_gap: float | None) -> float:
    """``EndTogether``'s score of a fit whose end gap is ``end_gap``."""
    return 0.0 if end_gap is None else 1.0 - end_gap


DEFAULT_SCORERS: tuple[Scorer, ...] = (BestFit(), Locality(), KeepWholeNodes(), EndTogether())

TIGHTEST_FIRST_SCORERS = (BestFit, Locality, KeepWholeNodes, EndTogether)
"""Scorers that never prefer a looser fit when the job has no model and no run-time
estimate (locality and end-together score 0 then; a whole free node comes last in
best-fit order). With only these, the search can stop at the first fit."""


def weighted(scorers: Sequence[Scorer], weights: Mapping[str, float]) -> list[tuple[float, Scorer]]:
    """The chain with its effective weights; scorers weighted 0 are dropped."""
    chain = [(weights.get(s.name, s.weight), s) for s in scorers]
    return [(w, s) for w, s in chain if w != 0]


def choose(
    need: Need,
    candidates: list[Candidate],
    chain: Sequence[tuple[float, Scorer]],
    fixed: Weights | None = None,
) -> Fit:
    """The best of ``candidates`` by weighted score; the earlier wins ties.

    ``fixed``: the chain's weights when it is the default chain (``fixed_weights``): the
    same sums, the default scorers called directly (a speed path for the common case).
    """
    if len(candidates) == 1:
        return candidates[0].fit
    best, best_score = candidates[0].fit, -math.inf
    for candidate in candidates:
        if fixed is not None:
            total = _default_total(need, candidate, fixed)
        else:
            total = 0.0
            for weight, s in chain:
                total += weight * s.score(need, candidate)
        if total > best_score:
            best, best_score = candidate.fit, total
    return best


Weights = tuple[float, float, float, float]
"""The weights of ``DEFAULT_SCORERS``, in their order."""


def fixed_weights(chain: Sequence[tuple[float, Scorer]]) -> Weights | None:
    """The weights of ``chain`` when it is the default one (these four classes, in this
    order, whatever their weights); else None."""
    kinds = [type(s) for _, s in chain]
    if kinds != [BestFit, Locality, KeepWholeNodes, EndTogether]:
        return None
    return (chain[0][0], chain[1][0], chain[2][0], chain[3][0])


def _default_total(need: Need, candidate: Candidate, w: Weights) -> float:
    return default_total(need, candidate.fit, candidate.locality, candidate.end_gap, w)


def default_total(need: Need, fit: Fit, locality: int, end_gap: float | None, w: Weights) -> float:
    """The default chain's weighted sum for a fit with this ``locality`` and ``end_gap``,
    in the chain's order (each scorer's own float operations): a caller that scores fits as
    they come needs no ``Candidate`` made for each."""
    total = 0.0
    total += w[0] * best_fit(need, fit)
    total += w[1] * (locality / LOADED)
    total += w[2] * keep_whole(need, fit)
    total += w[3] * end_together(end_gap)
    return total
