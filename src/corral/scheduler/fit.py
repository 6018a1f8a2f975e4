"""Dynamic fit: does a need fit a node's free capacity now, and which nodes to try.

``fit_on`` picks the cards on one node. ``search`` walks the capacity index in
best-fit order (fewest wholly free cards first; partly used cards first for
shared jobs) over the classes that passed the static filters, and returns
the first few nodes where the need fits. Scorers then choose among those few:
like Kubernetes' "percentage of nodes to score", the search is bounded, so a
cycle costs O(jobs x few buckets), not O(jobs x nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from corral.core.resources import MILLI
from corral.scheduler.capacity import PARTIAL_STEP, Capacity, NodeCap
from corral.scheduler.need import Need


@dataclass(frozen=True, slots=True)
class Fit:
    """Where exactly a need fits on a node: which cards, how much of each."""

    node: NodeCap
    gpus: tuple[int, ...]
    milli: int  # per card: MILLI for whole cards
    vram: int  # per card
    cpus: int

    @property
    def total_milli(self) -> int:
        return self.milli * len(self.gpus)


def fit_on(nc: NodeCap, need: Need) -> Fit | None:
    """The cards ``need`` would take on ``nc`` now, or ``None`` when it does not fit."""
    if nc.cpus_free < need.cpus:
        return None
    if need.cpu_only:
        return Fit(nc, (), 0, 0, need.cpus)
    if need.gpus:
        if nc.whole_free < need.gpus:
            return None
        cards = nc.whole_free_cards(need.vram, need.gpu_models)
        if len(cards) < need.gpus:
            return None
        chosen = tuple(cards[: need.gpus])
        return Fit(nc, chosen, MILLI, nc.gpu_vram[chosen[0]], need.cpus)
    card = nc.best_shared_gpu(need.vram, need.milli, need.gpu_models)
    if card is None:
        return None
    return Fit(nc, (card,), nc.milli_for(card, need.vram, need.milli), need.vram, need.cpus)


def search(cap: Capacity, need: Need, classes: Sequence[int], limit: int) -> list[Fit]:
    """Up to ``limit`` fits in best-fit order over nodes of ``classes``."""
    if need.cpu_only:
        return _search_cpu(cap, need, classes, limit)
    found: list[Fit] = []
    if need.shared:
        _search_partial(cap, need, classes, limit, found)
        if len(found) >= limit:
            return found
    _search_whole(cap, need, classes, limit, found)
    return found


def _search_whole(
    cap: Capacity, need: Need, classes: Sequence[int], limit: int, found: list[Fit]
) -> None:
    seen = {f.node.idx for f in found}
    for level in range(max(need.gpus, 1), cap.max_gpus + 1):
        for cls in classes:
            for nc in cap.whole_bucket(cls, level):
                if nc.idx in seen:
                    continue
                fit = fit_on(nc, need)
                if fit is not None:
                    found.append(fit)
                    if len(found) >= limit:
                        return


def _search_partial(
    cap: Capacity, need: Need, classes: Sequence[int], limit: int, found: list[Fit]
) -> None:
    start = min(max(need.milli, 1), MILLI - 1) // PARTIAL_STEP
    for level in range(start, MILLI // PARTIAL_STEP):
        for cls in classes:
            for nc in cap.partial_bucket(cls, level):
                fit = fit_on(nc, need)
                if fit is not None and nc.gpu_free[fit.gpus[0]] < MILLI:
                    found.append(fit)
                    if len(found) >= limit:
                        return


def _search_cpu(cap: Capacity, need: Need, classes: Sequence[int], limit: int) -> list[Fit]:
    """CPU work goes to GPU-less nodes first, then to nodes with the fewest free cards."""
    found: list[Fit] = []
    ordered = sorted(classes, key=lambda c: cap.class_gpus(c))
    for cls in ordered:
        for nc in cap.cpu_nodes(cls):
            fit = fit_on(nc, need)
            if fit is not None:
                found.append(fit)
                if len(found) >= limit:
                    return found
    return found
