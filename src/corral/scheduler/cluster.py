"""What a cycle starts from: node classes, capacity under the active allocations, caches.

``schedule`` builds a ``Cluster`` from a ``Snapshot``; the incremental ``Scheduler`` keeps
one between cycles and feeds it the world's changes. Nodes that every static filter
treats alike form one equivalence class, so filters run once per class, not per node.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

from corral.core.model import Allocation, Node
from corral.scheduler.api import Snapshot
from corral.scheduler.capacity import Capacity
from corral.scheduler.filters import DEFAULT_FILTERS, Filter, StaticChecks, class_key
from corral.scheduler.fit import Source
from corral.scheduler.need import Need


class Cluster:
    """Node classes, capacity under the active allocations, and static caches.

    ``label_keys``: node labels some queued job selects on (they split classes);
    ``models``: models some queued job names (holders get an index).
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        label_keys: Iterable[str],
        models: Iterable[str],
        active: Iterable[Allocation],
        filters: Sequence[Filter] = DEFAULT_FILTERS,
    ) -> None:
        self.label_keys = frozenset(label_keys)
        self.models = frozenset(models)
        classes, self.representatives = _classify(nodes, self.label_keys)
        self.class_members: list[list[int]] = [[] for _ in self.representatives]
        for i, cls in enumerate(classes):
            self.class_members[cls].append(i)
        self.cap = Capacity(nodes, classes, self.models, active)
        self.checks = StaticChecks(self.representatives, filters)
        self.sources: dict[tuple[Need, str], list[list[Source]]] = {}  # by need and model
        self.plain_sources: dict[Need, list[list[Source]]] = {}  # no model: no tuple to hash
        self.feasible: dict[Need, list[int]] = {}

    @staticmethod
    def of(snapshot: Snapshot) -> Cluster:
        """The cluster of a snapshot (its queued jobs decide label keys and models)."""
        keys = {k for job in snapshot.queued for k in job.node_selector}
        models = {job.model for job in snapshot.queued if job.model}
        return Cluster(snapshot.nodes, keys, models, [a for a in snapshot.allocations if a.active])


def node_ends(
    cap: Capacity, allocations: Iterable[Allocation], ends: Mapping[str, float]
) -> dict[int, float]:
    """Per node index, the latest expected end of its active allocations (known ends only)."""
    out: dict[int, float] = {}
    if not ends:
        return out
    for alloc in allocations:
        end = ends.get(alloc.id)
        nc = cap.by_name.get(alloc.node)
        if end is not None and nc is not None and alloc.active:
            old = out.get(nc.idx)
            if old is None or end > old:
                out[nc.idx] = end
    return out


def _classify(nodes: Sequence[Node], label_keys: frozenset[str]) -> tuple[list[int], list[Node]]:
    """Class id per node, and one representative node per class."""
    ids: dict[Hashable, int] = {}
    reps: list[Node] = []
    classes: list[int] = []
    for node in nodes:
        key = class_key(node, label_keys)
        cls = ids.get(key)
        if cls is None:
            cls = ids[key] = len(reps)
            reps.append(node)
        classes.append(cls)
    return classes, reps
