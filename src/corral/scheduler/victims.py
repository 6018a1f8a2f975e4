"""Running work that preemption could evict, kept by node and team between cycles.

``VictimIndex`` holds the active allocations that are still meant to run
(``desired`` run) whose allocation and priority class are preemptible, by
node, with the milli-GPUs each team holds on each node. The kept
``Scheduler`` updates it as allocations start and end, so a cycle that needs
to preempt does not first walk every allocation; the ``Preemptor`` turns the
allocations of the nodes it looks at into ``Victim`` units when it looks
(a gang is one unit, with every replica, and only if every replica may go).

The index is kept lazily: ``add`` and ``remove`` only note the change, and
``settle`` (called by the ``Preemptor`` when a cycle first needs victims)
brings the maps up to date. Most cycles preempt nothing, and work that
starts and ends between two cycles that do is never indexed at all (kept
eagerly, it cost 4% of a 20,000-job simulation in which no cycle asked).
The maps' contents after ``settle`` are what eager upkeep gives; the order
of their keys may differ, and no reader depends on it (victims and nodes
are sorted by total orders).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeVar

from corral.core.model import Allocation, PriorityClass
from corral.core.states import AllocDesired

K = TypeVar("K")
V = TypeVar("V")
_RUN: Final = AllocDesired.RUN  # a module constant: a compiled build reads it directly


@dataclass(slots=True, eq=False)
class Victim:
    """What one eviction removes: an allocation, or all allocations of a gang.

    Not frozen only because building many per cycle must be cheap; never changed.
    """

    allocs: tuple[Allocation, ...]
    team: str
    rank: int
    milli: int
    lost_s: float  # work since the last checkpoint (or start): what eviction throws away
    progress: float
    borrowed: bool  # placed beyond its team's quota: the first to give back
    started_at: float  # of its youngest allocation: the minimum run time counts from here
    cost: tuple[bool, float, float, str]  # borrowed first, least work lost, least progress


class VictimIndex:
    """Evictable running work by node and by team (see the module docstring)."""

    def __init__(self, classes: dict[str, PriorityClass]) -> None:
        self.classes = classes  # a dict, not any mapping: read natively per allocation
        self.on_node: dict[str, dict[str, Allocation]] = {}  # node -> evictable allocations
        self.by_jobs: dict[tuple[str, ...], dict[str, Allocation]] = {}  # running, per job set
        self.team_nodes: dict[str, dict[str, int]] = {}  # team -> node -> milli it holds there
        self.node_milli: dict[str, int] = {}  # node -> milli of its evictable allocations
        self._adding: dict[str, Allocation] = {}  # started since the last settle
        self._removing: list[Allocation] = []  # indexed, and ended since the last settle

    def add(self, alloc: Allocation) -> None:
        """An active allocation started (indexed at the next ``settle``)."""
        if alloc.desired is _RUN:
            self._adding[alloc.id] = alloc

    def remove(self, alloc: Allocation) -> None:
        """An active allocation ended (the same object ``add`` was given)."""
        if alloc.desired is not _RUN:
            return
        if self._adding.get(alloc.id) is alloc:  # never indexed: nothing to undo
            del self._adding[alloc.id]
        else:
            self._removing.append(alloc)

    def settle(self) -> None:
        """Bring the maps up to date with every ``add`` and ``remove`` since the last call."""
        removing, adding = self._removing, self._adding
        if not removing and not adding:
            return
        self._removing, self._adding = [], {}
        for alloc in removing:
            self._unindex(alloc)
        for alloc in adding.values():
            self._index(alloc)

    def _index(self, alloc: Allocation) -> None:
        inner_map(self.by_jobs, alloc.job_ids)[alloc.id] = alloc
        if not self._evictable(alloc):
            return
        node, milli = alloc.node, 0 if alloc.on_cpu else alloc.milli
        inner_map(self.on_node, node)[alloc.id] = alloc
        nodes = inner_map(self.team_nodes, alloc.team)
        nodes[node] = nodes.get(node, 0) + milli
        self.node_milli[node] = self.node_milli.get(node, 0) + milli

    def _unindex(self, alloc: Allocation) -> None:
        members = self.by_jobs[alloc.job_ids]
        del members[alloc.id]
        if not members:
            del self.by_jobs[alloc.job_ids]
        if not self._evictable(alloc):
            return
        node, team, milli = alloc.node, alloc.team, 0 if alloc.on_cpu else alloc.milli
        here = self.on_node[node]
        del here[alloc.id]
        # The team's entry for the node lives while one of its evictable allocations is
        # there: the node's few left in ``on_node`` say so (no count kept per team and node).
        nodes = self.team_nodes[team]
        if any(a.team == team for a in here.values()):  # a loop when compiled
            nodes[node] = nodes[node] - milli
        else:
            del nodes[node]
            if not nodes:
                del self.team_nodes[team]
        if here:
            self.node_milli[node] = self.node_milli[node] - milli
        else:
            del self.on_node[node]
            del self.node_milli[node]

    def units(self, node: str, now: float) -> list[Victim]:
        """The victims holding something on ``node``, cheapest to evict first (as of the
        last ``settle``)."""
        out: list[Victim] = []
        seen: set[tuple[str, ...]] = set()
        for alloc in self.on_node.get(node, {}).values():
            if alloc.job_ids in seen:
                continue
            seen.add(alloc.job_ids)
            members = self.by_jobs[alloc.job_ids]
            allocs = (
                (alloc,) if len(members) == 1 else tuple(sorted(members.values(), key=_alloc_id))
            )
            victim = self._unit(allocs, now)
            if victim is not None:
                out.append(victim)
        out.sort(key=_cost)
        return out

    def _unit(self, allocs: tuple[Allocation, ...], now: float) -> Victim | None:
        first = allocs[0]
        if len(allocs) == 1:
            milli, borrowed, started = (
                0 if first.on_cpu else first.milli,
                first.borrowed,
                first.started_at,
            )
        else:
            if not all(a.preemptible for a in allocs):
                return None  # a gang goes whole or not at all
            milli = sum(a.milli for a in allocs if not a.on_cpu)
            borrowed = all(a.borrowed for a in allocs)
            started = max(a.started_at for a in allocs)
        pclass = self.classes.get(first.priority)
        saved = max(first.last_checkpoint_at or first.started_at, first.started_at)
        lost = max(0.0, now - saved)
        cost = (not borrowed, lost, first.progress, first.id)
        rank = pclass.rank if pclass is not None else 0
        return Victim(
            allocs, first.team, rank, milli, lost, first.progress, borrowed, started, cost
        )

    def _evictable(self, alloc: Allocation) -> bool:
        pclass = self.classes.get(alloc.priority)
        return alloc.preemptible and (pclass is None or pclass.preemptible)


def milli_on(victim: Victim, node: str) -> int:
    """Milli-GPUs the victim holds on ``node``."""
    allocs = victim.allocs
    if len(allocs) == 1:
        return victim.milli
    return sum(a.milli for a in allocs if a.node == node and not a.on_cpu)


def inner_map(outer: dict[K, dict[str, V]], key: K) -> dict[str, V]:
    """``outer[key]``, made empty when missing (``setdefault`` would make a dict per call)."""
    inner = outer.get(key)
    if inner is None:
        inner = outer[key] = {}
    return inner


def _alloc_id(alloc: Allocation) -> str:
    return alloc.id


def _cost(victim: Victim) -> tuple[bool, float, float, str]:
    return victim.cost
