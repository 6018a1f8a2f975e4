"""Consolidation: move running work to other nodes so that a waiting job fits.

After a job found no room, even by preemption, the free cards it needs may
all exist, scattered: two free here, two there. ``Consolidator.make_room`` looks
for a node where moving one or two running allocations to other nodes, where
they fit *now*, leaves room for the job; as KAI-Scheduler's consolidation
action, a move is made only when it lets the waiting job run, and every moved
job must land somewhere (on the working copy: its new room is held for the
rest of the cycle).

A move is an eviction the mover comes back from at once: it is stopped with
its grace period to checkpoint, requeued, and placed again where it fits (by
the server's and the simulator's ordinary mechanisms; the plan names the node
it was seen to fit, ``Preemption.move_to``). So a mover must be one a
preemption could take (preemptible allocation and class, past its minimum run
time, not evicted already this cycle, of a class no higher than the waiting
job's), and it is never a gang's replica: a
gang would have to move whole, and a move that only works piecemeal would
break it. Its quota standing does not change: it holds as much afterwards.

Costs, cheapest first: fewest moves, then least work lost (work since the last
checkpoint: a job that just checkpointed loses almost nothing), then the node
first in the order. A mover goes only to a node of its own node class, so any
GPU model, label or backend it was placed for holds there too (an allocation
does not carry its job's constraints). Bounds: ``MOVES_PER_JOB`` movers for
one waiting job, ``Config.consolidation_moves`` per cycle, ``NODES_TO_TRY``
nodes and ``MOVERS_PER_NODE`` movers on each looked at per job.
"""

from __future__ import annotations

from typing import Final

from corral.core.model import Allocation
from corral.core.resources import MILLI, cpu_milli
from corral.scheduler.cycle import Cycle, Memo, current
from corral.scheduler.fit import Fit, fit_on
from corral.scheduler.need import Need
from corral.scheduler.node_cap import NodeCap
from corral.scheduler.preemption import Preemptor, Room
from corral.scheduler.victims import Victim, VictimIndex

MOVES_PER_JOB: Final = 2
"""Movers for one waiting job at most: beyond two, a move chain costs more work
lost than the wait for an ending job, and the search grows fast."""
NODES_TO_TRY: Final = 8
"""Nodes evaluated per waiting job, most free first: a bounded search."""
MOVERS_PER_NODE: Final = 4
"""Movers looked at per node, cheapest first: each costs a fit search elsewhere."""

Moves = list[tuple[Victim, Fit]]


class Consolidator:
    """The moves of one cycle (see the module docstring)."""

    def __init__(
        self,
        index: VictimIndex,
        preemptor: Preemptor,
        now: float,
        min_runtime_s: float,
        budget: int,
        cycle: Cycle,
    ) -> None:
        self._index = index
        self._preemptor = preemptor  # knows what this cycle evicted already (``gone``)
        self._now = now
        self._min_runtime_s = min_runtime_s
        self._budget = budget
        # mover's allocation id -> where it was seen to fit, held this cycle: a memo, so a
        # move the planner rolls back (the job's quota said no after all) is forgotten
        self._targets: Memo[str, Fit] = cycle.memo()
        self._others: dict[tuple[int, str], frozenset[str]] = {}
        # need -> the capacity generation at which no move helped it (rolled back with the
        # working copy, as the planner's memos are)
        self._failed: Memo[tuple[Need, int], int] = cycle.memo()
        self._rank = 0  # the class rank of the job moves are looked for

    @property
    def left(self) -> int:
        """Moves this cycle may still make."""
        return self._budget - len(self._targets.data)

    def may_help(self, cycle: Cycle, need: Need, rank: int) -> bool:
        """Might moves let ``need`` (of a class of ``rank``) fit (no failure noted since
        capacity last changed)?"""
        failed = current(self._failed.data.get((need, rank)), cycle.cap.generation)
        return self.left > 0 and not need.cpu_only and not failed

    def make_room(
        self,
        cycle: Cycle,
        need: Need,
        job: tuple[str, int],
        exclude: frozenset[str] = frozenset(),
    ) -> Room | None:
        """Move work on the working copy so ``need`` of ``job`` (id, class rank) fits;
        ``None`` (and no change) if no node can be cleared within the bounds. ``exclude``:
        nodes never to clear for it (their backend lacks a model the job needs)."""
        job_id, rank = job
        if not self.may_help(cycle, need, rank):
            return None
        self._rank = rank
        room = self._make_room(cycle, need, job_id, exclude)
        if room is None and not exclude:  # as ``Cycle.find`` remembers failures
            self._failed.put((need, rank), cycle.cap.generation)
        return room

    def _make_room(
        self, cycle: Cycle, need: Need, job_id: str, exclude: frozenset[str]
    ) -> Room | None:
        best: tuple[tuple[int, float, int], NodeCap] | None = None
        for nc in self._candidates(cycle, need):
            if nc.name in exclude:
                continue
            mark = cycle.checkpoint()
            found = self._try(cycle, nc, need)
            cycle.rollback(mark)
            if found is None:
                continue
            moves, _ = found
            key = (len(moves), sum(v.lost_s for v, _ in moves), nc.idx)
            if best is None or key < best[0]:
                best = (key, nc)
        if best is None:
            return None
        found = self._try(cycle, best[1], need)
        assert found is not None  # the what-if just showed it works
        moves, fit = found
        cycle.take(fit)
        why = []
        for victim, to in moves:
            self._preemptor.mark_gone(victim)
            alloc = victim.allocs[0]
            self._targets.put(alloc.id, to)
            why.append(
                f"consolidation: {alloc.job_ids[0]} moves from {alloc.node} to "
                f"{to.node.name}, where it fits now, so that {job_id} fits on {fit.node.name}"
            )
        victims = tuple(v for v, _ in moves)
        return Room(fit, victims, 0, tuple(why), tuple(to.node.name for _, to in moves))

    def give_back(self, cycle: Cycle) -> None:
        """At the end of the cycle, free the movers' rooms on the working copy: the plan
        places no allocation there (a moved job is placed again by a later cycle), and a
        kept scheduler keeps only what its plan says it took (``carried.py``)."""
        for fit in self._targets.data.values():
            cycle.cap.release(fit.node, fit.gpus, fit.milli, fit.vram, fit.cpus, fit.memory)
        self._budget = 0  # the cycle is over

    def _candidates(self, cycle: Cycle, need: Need) -> list[NodeCap]:
        """Feasible nodes where the need would fit were their movable work gone, most free
        first."""
        feasible = set(cycle.feasible_classes(need))
        want = need.nominal_milli()
        victims = self._index.nodes
        nodes, free = [], 0
        for nc in cycle.cap.nodes:
            if nc.cls in feasible and not nc.hidden:
                free += nc.milli_free
                if nc.milli_free + victims[nc.idx].milli >= want:
                    nodes.append(nc)
        if free < want:
            return []  # moves only rearrange: the free cards must add up to the job first
        nodes.sort(key=lambda nc: (-nc.milli_free, nc.idx))
        return nodes[:NODES_TO_TRY]

    def _try(self, cycle: Cycle, nc: NodeCap, need: Need) -> tuple[Moves, Fit] | None:
        """Move the cheapest movers off ``nc`` until ``need`` fits there, then put back any
        the job turned out not to need; ``None`` when it never fits (the caller rolls
        back either way)."""
        movers = [v for v in self._index.units(nc.idx, self._now) if self._movable(v)]
        movers.sort(key=lambda v: (v.lost_s, v.milli, v.allocs[0].id))
        del movers[MOVERS_PER_NODE:]
        most = min(MOVES_PER_JOB, self.left)
        start = cycle.checkpoint()
        moves = self._move(cycle, nc, need, movers, most)
        if moves is None:
            return None
        kept = [v for v, _ in moves]
        if len(kept) > 1:
            for spare in kept[:-1]:  # would the job fit without this one's move?
                cycle.rollback(start)
                fewer = [v for v in kept if v is not spare]
                if self._move(cycle, nc, need, fewer, most) is not None:
                    kept = fewer
            cycle.rollback(start)
            moves = self._move(cycle, nc, need, kept, most)
            assert moves is not None  # what was just shown to work
        fit = fit_on(nc, need)
        return None if fit is None else (moves, fit)

    def _move(
        self, cycle: Cycle, nc: NodeCap, need: Need, movers: list[Victim], most: int
    ) -> Moves | None:
        moves: Moves = []
        for victim in movers:
            if len(moves) >= most:
                break
            alloc = victim.allocs[0]
            cycle.unhold(alloc)
            to = cycle.find(_need(alloc), None, exclude=self._elsewhere(cycle, nc))
            if to is None:
                cycle.hold(alloc)
                continue
            cycle.take(to)
            moves.append((victim, to))
            if fit_on(nc, need) is not None:
                return moves
        return None

    def _movable(self, victim: Victim) -> bool:
        alloc = victim.allocs[0]
        return (
            len(victim.allocs) == 1
            and victim.rank <= self._rank  # a lower class never disturbs a higher one
            and not self._preemptor.gone(victim)
            and self._now - victim.started_at >= self._min_runtime_s
            and not alloc.on_cpu
            and alloc.milli > 0
        )

    def _elsewhere(self, cycle: Cycle, nc: NodeCap) -> frozenset[str]:
        """Nodes a mover from ``nc`` may not go to: ``nc`` and other node classes."""
        key = (nc.cls, nc.name)
        names = self._others.get(key)
        if names is None:
            names = self._others[key] = frozenset(
                o.name for o in cycle.cap.nodes if o.cls != nc.cls or o is nc
            )
        return names


def _need(alloc: Allocation) -> Need:
    """What ``alloc`` holds, as a need: whole cards, or its share of one."""
    cpus, memory = cpu_milli(alloc.cpus), alloc.memory_bytes
    if alloc.gpu_milli >= MILLI:
        return Need(gpus=len(alloc.gpu_indices), cpus=cpus, memory=memory)
    return Need(milli=alloc.gpu_milli, vram=alloc.vram_bytes, cpus=cpus, memory=memory)
