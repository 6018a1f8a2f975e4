"""Preemption: evict running work so that a job that is owed capacity can run.

Two kinds, both decided here and never by chance:

* **reclaim** - a team under its quota takes back capacity that other teams
  borrow: victims are allocations of teams *over* their quota (marked
  ``borrowed``, or plainly in excess), of a class no higher than the job's;
* **priority** - inside one team, a class that ``can_preempt`` evicts work of
  lower, preemptible classes;
* **across** - a class that may ``preempt_other_teams`` evicts other teams'
  work of lower classes, as reclaim does: only what those teams hold beyond
  their quota, so no team is ever pushed below its guarantee.

Never evicted: non-preemptible allocations (the allocation's flag or its
class), work younger than ``min_runtime_before_preemption_s``, work already
being stopped, work placed in this cycle. A gang's allocations go together.

A team is a reclaim victim while it holds more than its quota, counted as
each victim is chosen (as Kueue does): the last eviction may take it below
its quota by less than one allocation, because the asking team is owed its
whole quota and the lender only what it was guaranteed. Its ``borrowed``
flags only order the victims (borrowed first); they do not gate eligibility,
since they are recomputed only at the end of a cycle (``borrowing.py``).

For each node that could run the job, victims are released on the working
copy cheapest first (borrowed before not, then least work lost since the
last checkpoint, then least progress) until the job fits; victims that turn
out not to be needed are reprieved; the copy is rolled back. The node with
the fewest victims, then the fewest evicted GPUs the job would leave idle,
then the fewest not borrowed, then the least work lost, wins, and only then
is anything committed: there is no preemption that does not let the
preemptor run, and none that frees a card the preemptor could do without
when another node needed less.

Nor one that costs more than waiting would: when the best room now takes more
than one eviction, or leaves evicted cards idle, and work still inside its
minimum run time would give a cheaper room (fewer evictions, then fewer idle
cards) once it may go, the job waits for that (its queue explanation says
when). On a real cluster work started in one cycle passes its minimum a few
milliseconds apart; without this, the first to pass would all be taken, two
for a job that one would have served a moment later.

Each victim carries its true reason (``Room.why``): which team is owed its
quota and how far over its own the victim's team was, or which class
outranks which.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from corral.core.model import PriorityClass
from corral.core.resources import MILLI
from corral.scheduler.cycle import Cycle, Memo
from corral.scheduler.fit import Fit, fit_on
from corral.scheduler.need import Need
from corral.scheduler.node_cap import NodeCap
from corral.scheduler.quota import Ledger
from corral.scheduler.victims import Victim, VictimIndex, milli_on

NODES_TO_TRY: Final = 16
"""Nodes where evictions would work, evaluated per attempt at most (those with the
most reclaimable room first): bounds the cost in a full cluster. A one-victim
option stops the search at once."""


@dataclass(frozen=True, slots=True)
class Ask:
    """Who wants room, and which kinds of preemption it may use.

    The hash is kept (as ``Need`` keeps its own): asks are parts of memo keys
    looked up on every liveness check.
    """

    team: str
    rank: int
    reclaim: bool  # the team is under quota: it may take back borrowed capacity
    priority: bool  # its class can_preempt: it may evict lower classes of its team
    across: bool = False  # its class may preempt other teams' lower classes beyond their quota
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        key = (self.team, self.rank, self.reclaim, self.priority, self.across)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True, slots=True)
class Room:
    """Where a job fits once ``victims`` are gone; ``idle``: milli-GPUs evicted that the job
    would not use; ``why``: each victim's reason, once committed (``make_room``);
    ``moves``: for a consolidation (``consolidation.py``), the node each victim moves to."""

    fit: Fit
    victims: tuple[Victim, ...]
    idle: int = 0
    why: tuple[str, ...] = ()
    moves: tuple[str, ...] = ()


class Preemptor:
    """Victims of one cycle, by node, and the what-if search."""

    def __init__(
        self,
        index: VictimIndex,
        now: float,
        min_runtime_s: float,
        cycle: Cycle,
    ) -> None:
        self._now = now
        # Released on the working copy, and evictable milli left per node: memos,
        # so they roll back with the working copy.
        self._gone: Memo[str, bool] = cycle.memo()
        self._left: Memo[int, int] = cycle.memo()  # by node index
        self._min_runtime_s = min_runtime_s
        self._index = index
        self._victims_at = index.nodes  # node index -> its victims (and the milli they hold)
        self._units: dict[int, list[Victim]] = {}  # node index -> victims, built when looked at
        self._orders: dict[str, list[NodeCap]] = {}
        self._young = False  # the last search passed over a victim inside its minimum run time

    def _by_node(self, node: int) -> list[Victim]:
        units = self._units.get(node)
        if units is None:
            units = self._units[node] = self._index.units(node, self._now)
        return units

    def gone(self, victim: Victim) -> bool:
        """Is ``victim`` evicted (or moved) already this cycle, on the working copy?"""
        return bool(self._gone.get(victim.allocs[0].id))

    def mark_gone(self, victim: Victim) -> None:
        """``victim`` leaves this cycle another way (a consolidation move)."""
        self._gone.put(victim.allocs[0].id, True)

    def make_room(
        self, cycle: Cycle, ledger: Ledger, need: Need, ask: Ask, *, patient: bool = False
    ) -> Room | None:
        """Evict on the working copy so ``need`` fits; ``None`` (and no change) if it cannot.

        ``patient`` ignores the minimum run time: "would preemption help once
        the victims have run long enough?" (for the ``preempt`` remedy).
        """
        self._young = False
        best = self._best(cycle, ledger, need, ask, patient)
        if best is None:
            return None
        if not patient and self._young and best[0][:2] != (1, 0):
            # Costlier than one eviction that leaves nothing idle, and the search passed
            # over work too young to evict: wait if it would make cheaper room once it has
            # run its minimum.
            later = self._best(cycle, ledger, need, ask, True)
            if later is not None and later[0][:2] < best[0][:2]:
                return None
        why: list[str] = []
        for victim in best[1].victims:
            why.append(_reason(ledger, victim, ask))
            self._release(cycle, victim)
            self._gone.put(victim.allocs[0].id, True)
            ledger.add(victim.team, -victim.milli)
            for node in {a.node for a in victim.allocs}:
                held = cycle.node(node)
                if held is not None:  # nothing looks for victims on a node not held
                    idx = held.idx
                    self._left.put(idx, self._evictable(idx) - milli_on(victim, node))
        fit = fit_on(best[1].fit.node, need)
        assert fit is not None  # the what-if just showed it fits
        cycle.take(fit)
        return Room(fit, best[1].victims, best[1].idle, tuple(why))

    def _best(
        self, cycle: Cycle, ledger: Ledger, need: Need, ask: Ask, patient: bool
    ) -> tuple[tuple[int, int, int, float, int], Room] | None:
        """The cheapest room over the candidate nodes (``_badness``), nothing committed."""
        best: tuple[tuple[int, int, int, float, int], Room] | None = None
        tried = 0
        for nc in self._candidates(cycle, ledger, need, ask):
            room = self._try_node(cycle, ledger, nc, need, ask, patient)
            if room is None:
                continue
            tried += 1
            key = _badness(room, nc.idx)
            if best is None or key < best[0]:
                best = (key, room)
            if key[:3] == (1, 0, 0) or tried >= NODES_TO_TRY:
                break
        return best

    def _candidates(self, cycle: Cycle, ledger: Ledger, need: Need, ask: Ask) -> Iterator[NodeCap]:
        """Feasible nodes holding work this ask may evict, most room (free + victims) first.

        Only teams whose work could be a victim are looked at: the asking team
        (priority preemption) and teams over quota (reclaim). The order is fixed
        at the first ask of the cycle, a heuristic: eligibility is checked per node.
        """
        feasible = set(cycle.feasible_classes(need))
        teams = [
            t
            for t in self._index.teams()
            if (t == ask.team and ask.priority)
            or (t != ask.team and (ask.reclaim or ask.across) and ledger.over_quota(t))
        ]
        seen: set[int] = set()
        for team in sorted(teams):
            for nc in self._order(cycle, team):
                if nc.idx not in seen and nc.cls in feasible and not nc.hidden:
                    seen.add(nc.idx)
                    yield nc

    def _order(self, cycle: Cycle, team: str) -> list[NodeCap]:
        cached = self._orders.get(team)
        if cached is None:
            scored = []
            nodes = cycle.cap.nodes  # the index's node indices are the cycle's
            for idx, milli in self._index.nodes_of(team):
                nc = nodes[idx]
                scored.append((-(milli + nc.milli_free), nc.idx, nc))
            scored.sort(key=lambda item: (item[0], item[1]))
            cached = self._orders[team] = [nc for _, _, nc in scored]
        return cached

    def _evictable(self, node: int) -> int:
        """Milli-GPUs of not yet evicted victims on node index ``node``."""
        left = self._left.get(node)
        return self._victims_at[node].milli if left is None else left

    def _try_node(
        self, cycle: Cycle, ledger: Ledger, nc: NodeCap, need: Need, ask: Ask, patient: bool
    ) -> Room | None:
        if need.nominal_milli() > nc.milli_free + self._evictable(nc.idx):
            return None  # even evicting everything there would not be enough
        free = nc.milli_free
        mark = cycle.checkpoint()
        spent: dict[str, int] = {}
        chosen: list[Victim] = []
        fit = None
        for victim in self._by_node(nc.idx):
            if not self._eligible(victim, ledger, ask, patient, spent):
                continue
            self._release(cycle, victim)
            spent[victim.team] = spent.get(victim.team, 0) + victim.milli
            chosen.append(victim)
            fit = fit_on(nc, need)
            if fit is not None:
                break
        if fit is not None:
            chosen = self._reprieve(cycle, nc, need, chosen)
            fit = fit_on(nc, need)
        cycle.rollback(mark)
        if fit is None:
            return None
        evicted = sum(milli_on(v, nc.name) for v in chosen)
        idle = max(0, min(evicted, free + evicted - fit.total_milli))
        return Room(fit, tuple(chosen), idle)

    def _reprieve(
        self, cycle: Cycle, nc: NodeCap, need: Need, chosen: list[Victim]
    ) -> list[Victim]:
        """Put back, most expensive first, victims the job does not need gone."""
        kept = list(chosen)
        for victim in sorted(chosen[:-1], key=lambda v: v.cost, reverse=True):
            for alloc in victim.allocs:
                cycle.hold(alloc)
            if fit_on(nc, need) is not None:
                kept.remove(victim)
            else:
                self._release(cycle, victim)
        return kept

    def _eligible(
        self, victim: Victim, ledger: Ledger, ask: Ask, patient: bool, spent: Mapping[str, int]
    ) -> bool:
        if self._gone.get(victim.allocs[0].id) or victim.rank > ask.rank:
            return False
        if not patient and self._now - victim.started_at < self._min_runtime_s:
            self._young = True
            return False
        if victim.team == ask.team:
            return ask.priority and victim.rank < ask.rank
        if not (ask.reclaim or (ask.across and victim.rank < ask.rank)):
            return False
        return ledger.used(victim.team) - spent.get(victim.team, 0) > ledger.quota(victim.team)

    @staticmethod
    def _release(cycle: Cycle, victim: Victim) -> None:
        for alloc in victim.allocs:
            cycle.unhold(alloc)


def _badness(room: Room, idx: int) -> tuple[int, int, int, float, int]:
    """Fewest evicted allocations, then fewest evicted GPUs left idle, then fewest not
    borrowed, then least work lost."""
    victims = room.victims
    return (
        sum(len(v.allocs) for v in victims),
        room.idle,
        sum(len(v.allocs) for v in victims if not v.borrowed),
        sum(v.lost_s for v in victims),
        idx,
    )


def _reason(ledger: Ledger, victim: Victim, ask: Ask) -> str:
    """Why ``victim`` goes, from the ledger before its eviction is counted."""
    if victim.team == ask.team:
        return ""  # the planner names the classes (``Planner._record``)
    used, quota = ledger.used(victim.team) / MILLI, ledger.quota(victim.team) / MILLI
    owed = ledger.quota(ask.team) / MILLI
    return (
        f"reclaim: team {ask.team} is owed its quota of {owed:g} GPUs; "
        f"team {victim.team} held {used:g}, over its quota of {quota:g}"
    )


def ask_for(team: str, pclass: PriorityClass, guaranteed: bool) -> Ask:
    """What work of ``pclass`` may evict: ``guaranteed``, in the within-quota pass."""
    # ``Planner.may_fit`` reads ``reclaim or priority or across`` as
    # ``guaranteed or evicts(pclass)``
    return Ask(
        team,
        pclass.rank,
        reclaim=guaranteed,
        priority=pclass.can_preempt,
        across=pclass.preempt_other_teams,
    )


def evicts(pclass: PriorityClass) -> bool:
    """May work of ``pclass`` evict anyone without being owed its quota?"""
    return pclass.can_preempt or pclass.preempt_other_teams
