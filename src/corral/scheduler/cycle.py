"""One scheduling cycle's working state: node classes, capacity, caches.

``Cycle`` is built from a ``Snapshot`` at the start of ``schedule`` and thrown
away at the end. It answers one question fast: where does this need fit
best right now (``find``), and records the answer (``take``) on the working
copy of capacity, which supports checkpoint/rollback for what-ifs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from corral.core.model import Allocation, Job, Node
from corral.scheduler.api import Config, Snapshot
from corral.scheduler.capacity import Capacity, NodeCap
from corral.scheduler.filters import DEFAULT_FILTERS, Filter, StaticChecks, class_key
from corral.scheduler.fit import Fit, search
from corral.scheduler.need import Need
from corral.scheduler.scorers import ABSENT, DEFAULT_SCORERS, LOADED, ON_DISK, Scorer, choose

Tier = tuple[int, list[int]]
"""A locality level and the node classes at that level."""


class Cycle:
    """Working state of one cycle. Not thread-safe; not reused across cycles."""

    def __init__(
        self,
        snapshot: Snapshot,
        config: Config,
        now: float,
        filters: Sequence[Filter] = DEFAULT_FILTERS,
        scorers: Sequence[Scorer] = DEFAULT_SCORERS,
    ) -> None:
        self.config = config
        self.now = now
        self.scorers = scorers
        classes, self.representatives = _classify(snapshot.nodes, snapshot.queued)
        self.class_members: list[list[int]] = [[] for _ in self.representatives]
        for i, cls in enumerate(classes):
            self.class_members[cls].append(i)
        self.cap = Capacity(snapshot.nodes, classes)
        self.checks = StaticChecks(self.representatives, filters)
        self._tiers: dict[tuple[Need, str | None], list[Tier]] = {}
        self._failed: dict[Need, int] = {}
        for alloc in snapshot.allocations:
            if alloc.active:
                self.hold(alloc)
        self.cap.forget_journal()

    def hold(self, alloc: Allocation) -> None:
        """Count an existing allocation against its node's capacity."""
        nc = self.cap.by_name.get(alloc.node)
        if nc is not None:
            gpus = () if alloc.on_cpu else alloc.gpu_indices
            self.cap.reserve(nc, gpus, alloc.gpu_milli, alloc.vram_bytes, alloc.cpus)

    def unhold(self, alloc: Allocation) -> None:
        """Give an allocation's capacity back (a preemption, on the working copy)."""
        nc = self.cap.by_name.get(alloc.node)
        if nc is not None:
            gpus = () if alloc.on_cpu else alloc.gpu_indices
            self.cap.release(nc, gpus, alloc.gpu_milli, alloc.vram_bytes, alloc.cpus)

    def tiers(self, need: Need, model: str | None) -> list[Tier]:
        """Statically feasible classes grouped by locality of ``model``, best first."""
        key = (need, model)
        cached = self._tiers.get(key)
        if cached is not None:
            return cached
        levels: dict[int, list[int]] = {}
        for cls in self.cap.classes():
            if self.checks.reason(need, cls) is None:
                levels.setdefault(self._locality(cls, model), []).append(cls)
        tiers = [(level, levels[level]) for level in sorted(levels, reverse=True)]
        self._tiers[key] = tiers
        return tiers

    def find(self, need: Need, model: str | None) -> Fit | None:
        """The best place for ``need`` now, or ``None`` (cached until capacity grows)."""
        failed_at = self._failed.get(need)
        if failed_at == self.cap.generation:
            return None
        limit = max(1, self.config.candidates_per_tier)
        fits: list[tuple[Fit, int]] = []
        for locality, classes in self.tiers(need, model):
            fits.extend((fit, locality) for fit in search(self.cap, need, classes, limit))
        if not fits:
            self._failed[need] = self.cap.generation
            return None
        return choose(need, fits, self.scorers, self.config.scorer_weights)

    def take(self, fit: Fit) -> None:
        """Reserve ``fit`` on the working copy."""
        self.cap.reserve(fit.node, fit.gpus, fit.milli, fit.vram, fit.cpus)

    def node(self, name: str) -> NodeCap | None:
        return self.cap.by_name.get(name)

    def _locality(self, cls: int, model: str | None) -> int:
        if model is None:
            return ABSENT
        rep = self.representatives[cls]
        if model in rep.models_loaded:
            return LOADED
        return ON_DISK if model in rep.models_on_disk else ABSENT


def _classify(nodes: Sequence[Node], queued: Sequence[Job]) -> tuple[list[int], list[Node]]:
    """Class id per node, and one representative node per class."""
    label_keys = frozenset(k for job in queued for k in job.node_selector)
    models = frozenset(job.model for job in queued if job.model)
    ids: dict[Hashable, int] = {}
    reps: list[Node] = []
    classes: list[int] = []
    for node in nodes:
        key = class_key(node, label_keys, models)
        cls = ids.get(key)
        if cls is None:
            cls = ids[key] = len(reps)
            reps.append(node)
        classes.append(cls)
    return classes, reps
