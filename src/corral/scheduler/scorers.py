"""Scorers: among the nodes where a job fits, which is best (STYLE.md habit 5).

A scorer is a tiny protocol: a ``name`` and ``score(need, fit, locality)``
returning a number in [0, 1] (or [-1, 0] for a penalty). The pipeline sums
``weight x score`` over the chain and takes the highest, ties going to the
earlier candidate (the tighter fit), so the result is deterministic.

Default weights say what matters more: a model already loaded in VRAM saves
a model swap (tens of seconds of a card), which beats a slightly tighter
pack; a model on disk saves a download; breaking a whole free node is a
cost, because big jobs and gangs need whole nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from corral.scheduler.capacity import LOADED
from corral.scheduler.fit import Fit
from corral.scheduler.need import Need


class Scorer(Protocol):
    """Rates one candidate; higher is better. ``weight`` is its default weight."""

    name: str
    weight: float

    def score(self, need: Need, fit: Fit, locality: int) -> float: ...


class BestFit:
    """Bin packing: the fuller the node after placement, the better."""

    name = "best_fit"
    weight = 1.0

    def score(self, need: Need, fit: Fit, locality: int) -> float:
        nc = fit.node
        if need.cpu_only:
            total = nc.node.cpus or 1
            return 1.0 - (nc.cpus_free - fit.cpus) / total
        total_cards = nc.gpu_count or 1
        free_after = sum(nc.gpu_free) - fit.total_milli
        return 1.0 - free_after / (total_cards * 1000)


class Locality:
    """Prefer a node whose backend has the model loaded, then one that has it on disk."""

    name = "locality"
    weight = 2.0

    def score(self, need: Need, fit: Fit, locality: int) -> float:
        return locality / LOADED


class KeepWholeNodes:
    """Anti-fragmentation: a penalty for starting on a wholly free node with a small job."""

    name = "keep_whole_nodes"
    weight = 0.5

    def score(self, need: Need, fit: Fit, locality: int) -> float:
        nc = fit.node
        if need.cpu_only or nc.gpu_count == 0 or nc.whole_free < nc.gpu_count:
            return 0.0
        return 0.0 if len(fit.gpus) == nc.gpu_count else -1.0


DEFAULT_SCORERS: tuple[Scorer, ...] = (BestFit(), Locality(), KeepWholeNodes())


def choose(
    need: Need,
    fits: Sequence[tuple[Fit, int]],
    scorers: Sequence[Scorer],
    weights: Mapping[str, float],
) -> Fit:
    """The best of ``fits`` (each with its locality); earlier wins ties."""
    best, best_score = fits[0][0], float("-inf")
    for fit, locality in fits:
        total = 0.0
        for s in scorers:
            total += weights.get(s.name, s.weight) * s.score(need, fit, locality)
        if total > best_score:
            best, best_score = fit, total
    return best
