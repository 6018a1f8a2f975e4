"""Running work that preemption could evict, kept by node and team between cycles.

``VictimIndex`` holds the active allocations that are still meant to run
(``desired`` run) whose allocation and priority class are preemptible, by
node index, with the milli-GPUs each team holds on each node. The kept
``Scheduler`` updates it as allocations start and end, giving their slots
(``slots.py``: the index holds those and never looks an allocation up by its
id), so a cycle that needs to preempt does not first walk every allocation;
the ``Preemptor`` turns the allocations of the nodes it looks at into
``Victim`` units when it looks (a gang is one unit, with every replica, and
only if every replica may go).

The index is kept eagerly: ``add`` and ``remove`` update it as each allocation starts
and ends (most cycles of a busy cluster need victims). Allocations on nodes the
scheduler does not hold are in ``by_jobs`` only (a gang's unit counts every replica);
nothing looks for victims there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from corral.core.compiled import mypyc_attr
from corral.core.model import Allocation, PriorityClass
from corral.core.states import AllocDesired
from corral.scheduler.slots import NOWHERE, Slot

if TYPE_CHECKING:
    from mypy_extensions import i64

_RUN: Final = AllocDesired.RUN


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


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class TeamEvictable:
    """A team's evictable allocations on one node: how many, and the milli they hold."""

    __slots__ = ("count", "milli")

    def __init__(self) -> None:
        self.count: i64 = 0
        self.milli: i64 = 0


class NodeVictims:
    """One node's evictable work: its slots, the milli they hold, and each team's share by
    team number (``TeamEvictable``)."""

    __slots__ = ("milli", "slots", "teams")

    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.milli: i64 = 0
        self.teams: list[TeamEvictable] = []  # by team number; made as teams first come here


class VictimIndex:
    """Evictable running work by node and by team (see the module docstring)."""

    def __init__(self, classes: dict[str, PriorityClass], nodes: int) -> None:
        self.classes = classes
        self.nodes: list[NodeVictims] = [NodeVictims() for _ in range(nodes)]  # by node index
        # running, by the first job of their job set: the first slot indexed, which leads
        # to the others of that job set (``Slot.kin``)
        self.by_jobs: dict[str, Slot] = {}
        # By team number (``Slot.team``): on how many nodes it has any evictable work, and
        # its name (``teams``, ``nodes_of``)
        self._team_spread: list[int] = []
        self._team_name: list[str] = []

    def add(self, slot: Slot) -> None:
        """An active allocation started (in ``slot``)."""
        if slot.alloc.desired is _RUN:
            self._index(slot)

    def remove(self, slot: Slot) -> None:
        """An active allocation ended (the slot ``add`` was given)."""
        if slot.alloc.desired is _RUN:
            self._unindex(slot)

    def _index(self, slot: Slot) -> None:
        alloc = slot.alloc
        key = slot.first = _first(alloc.job_ids)
        # one look-up: the job set's first slot indexed stays the map's; a later one (a
        # gang's other replicas) goes second in its chain (``units`` sorts them anyway)
        head = self.by_jobs.setdefault(key, slot)
        if head is slot:
            slot.kin = None  # a slot indexed again (a new index of the same slots) starts afresh
        else:
            slot.kin = head.kin
            head.kin = slot
        node = slot.node
        slot.victim_at = -1  # not on its node's list (yet): what ``_unindex`` reads
        if node == NOWHERE or not self._evictable(alloc):
            return
        milli: i64 = 0 if alloc.on_cpu else alloc.milli
        here = self.nodes[node]
        _enter(here.slots, slot)
        teams, team = here.teams, slot.team
        while len(teams) <= team:
            teams.append(TeamEvictable())
        while len(self._team_spread) <= team:
            self._team_spread.append(0)
            self._team_name.append("")
        held = teams[team]
        if held.count == 0:  # the team's first evictable allocation on this node
            self._team_spread[team] = self._team_spread[team] + 1
            self._team_name[team] = alloc.team
        held.count += 1
        held.milli += milli
        here.milli += milli

    def _unindex(self, slot: Slot) -> None:
        alloc = slot.alloc
        key = slot.first  # noted by ``_index``
        kin = self.by_jobs[key]
        if kin is slot:
            if slot.kin is None:
                del self.by_jobs[key]
            else:
                self.by_jobs[key] = slot.kin
        else:  # a gang's: a walk of its few
            while kin.kin is not slot:
                after = kin.kin
                assert after is not None, "an indexed slot is in its first job's chain"
                kin = after
            kin.kin = slot.kin
        slot.kin = None
        if slot.victim_at < 0:  # not evictable, or not on a node held: on no node's list
            return
        milli: i64 = 0 if alloc.on_cpu else alloc.milli
        here = self.nodes[slot.node]
        _leave(here.slots, slot)
        # The team counts on the node while one of its evictable allocations is there.
        held = here.teams[slot.team]
        held.count -= 1
        held.milli -= milli
        if held.count == 0:
            self._team_spread[slot.team] = self._team_spread[slot.team] - 1
        here.milli -= milli

    def teams(self) -> list[str]:
        """The teams with evictable work on some node."""
        return [name for t, name in enumerate(self._team_name) if self._team_spread[t]]

    def nodes_of(self, team: str) -> list[tuple[int, int]]:
        """(node index, milli-GPUs) of each node where ``team`` has evictable work, by
        index: O(nodes), asked once per team by a cycle that preempts."""
        for t, name in enumerate(self._team_name):
            if name == team and self._team_spread[t]:
                return [
                    (node, here.teams[t].milli)
                    for node, here in enumerate(self.nodes)
                    if t < len(here.teams) and here.teams[t].count
                ]
        return []

    def units(self, node: int, now: float) -> list[Victim]:
        """The victims holding something on node index ``node``, cheapest to evict first."""
        out: list[Victim] = []
        seen: set[tuple[str, ...]] = set()
        for slot in self.nodes[node].slots:
            alloc = slot.alloc
            if alloc.job_ids in seen:
                continue
            seen.add(alloc.job_ids)
            kin: Slot | None = self.by_jobs[_first(alloc.job_ids)]
            assert kin is not None
            if kin.kin is None:
                allocs: tuple[Allocation, ...] = (alloc,)
            else:
                members = []
                while kin is not None:
                    if kin.alloc.job_ids == alloc.job_ids:
                        members.append(kin.alloc)
                    kin = kin.kin
                allocs = tuple(sorted(members, key=_alloc_id))
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


def _enter(victims: list[Slot], slot: Slot) -> None:
    """Put ``slot`` at the end of a node's ``victims``, noting where."""
    slot.victim_at = len(victims)
    victims.append(slot)


def _leave(victims: list[Slot], slot: Slot) -> None:
    """Take ``slot`` out of a node's ``victims``: the last one takes its place (as
    ``slots.leave`` does for a node's work)."""
    last = victims.pop()
    if last is not slot:
        victims[slot.victim_at] = last
        last.victim_at = slot.victim_at
    slot.victim_at = -1


def _first(job_ids: tuple[str, ...]) -> str:
    """The key of a job set in ``VictimIndex.by_jobs``."""
    return job_ids[0] if job_ids else ""


def _alloc_id(alloc: Allocation) -> str:
    return alloc.id


def _cost(victim: Victim) -> tuple[bool, float, float, str]:
    return victim.cost
