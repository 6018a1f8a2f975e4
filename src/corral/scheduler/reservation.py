"""Backfill reservations: the big job at the head of its class gets the nodes that free up first.

Without them, small jobs keep taking the cards a big job (a whole node, a
gang) is waiting for: each time a card frees, the next small job in the queue
fits there, and the big job waits for a moment when a whole node happens to be
free. Slurm's answer, and ours:

* **head of line** - at the start of each pass over a priority class, its
  oldest waiting job that asks for at least ``Config.reserve_min_gpus`` whole
  GPUs (all replicas together) and may run in that pass (quota) is decided
  first. If it cannot start, it gets the node(s) where its replicas should fit
  soonest: each card is free at the expected end of the work on it (run-time
  estimates, ``Snapshot.expected_ends``; this cycle's placements count with
  theirs), and a node fits at the time its n-th usable card frees. Candidates
  are the nodes with the most free cards, then the busy nodes whose work
  ends first (a bounded search); without estimates, the nodes with the most
  free cards win. Reserved nodes are *hidden* for the rest of the cycle: no
  later job sees them.
* **backfill** - a later job with a run-time estimate that ends before a
  reservation's expected start may still use that reservation's free cards:
  it delays nobody. Jobs without an estimate never backfill; nor does anything
  into a reservation whose start is unknown.

Reservations last one cycle, like everything else the scheduler decides;
the next cycle makes them again and finds the same nodes, since nobody
else took their free cards in the meantime, until the big job fits. Classes
of higher rank still go first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from corral.core.model import Allocation
from corral.core.resources import MILLI
from corral.scheduler.api import Reason, ReasonCode
from corral.scheduler.cycle import Cycle, Memo
from corral.scheduler.fit import Fit, fit_on
from corral.scheduler.need import Need
from corral.scheduler.node_cap import Card, NodeCap

if TYPE_CHECKING:
    from mypy_extensions import i64

NodeWork = Callable[[str], Iterable[tuple[Allocation, float | None]]]
"""The active allocations on a node (by name), each with its expected end (None: unknown)."""

CANDIDATES: Final = 16
"""Nodes rated per reservation (those with the most free cards): bounds the cost per cycle."""

INF: Final = math.inf


@dataclass(frozen=True, slots=True)
class Reservation:
    """Nodes held for ``job_id`` until ``start`` (``inf``: when is not known)."""

    job_id: str
    nodes: tuple[NodeCap, ...]
    start: float


class Reservations:
    """The reservations of one cycle, and backfill into them."""

    def __init__(self, cycle: Cycle, work: NodeWork) -> None:
        self.cycle = cycle
        self.now = cycle.now
        self.min_gpus = cycle.config.reserve_min_gpus
        self._work = work
        self.held: list[Reservation] = []
        self._latest = -INF  # the latest known start among the reservations
        # need -> (generation, reservations, shortest run time that found no room)
        self._failed: Memo[Need, tuple[int, int, float]] = cycle.memo()

    def big(self, need: Need, replicas: int) -> bool:
        """Does a job of this shape get a reservation when it heads its class?"""
        if self.min_gpus is None or need.cpu_only:
            return False
        return need.gpus * replicas >= self.min_gpus

    def reserve(self, job_id: str, need: Need, replicas: int) -> None:
        """Hide the nodes where ``need`` x ``replicas`` should fit soonest."""
        rated = self._soonest(need)
        if len(rated) < replicas:
            return
        chosen = rated[:replicas]
        start = max(when for when, *_ in chosen)
        nodes = tuple(nc for *_, nc in chosen)
        for nc in nodes:
            self.cycle.cap.hide(nc)
        self.held.append(Reservation(job_id, nodes, start))
        if start < INF:
            self._latest = max(self._latest, start)

    def could_backfill(self, need: Need, runtime: float | None) -> bool:
        """Might a job of ``need`` ending after ``runtime`` backfill (no memo says no)?"""
        if runtime is None or self.now + runtime > self._latest:
            return False
        failed = self._failed.data.get(need)
        if failed is None:
            return True
        generation, count, shortest = failed
        stale = generation != self.cycle.cap.generation or count != len(self.held)
        return stale or runtime < shortest

    def backfill(self, need: Need, runtime: float | None) -> Fit | None:
        """Place a job that ends before a reservation starts on that reservation's free cards."""
        if runtime is None or not self.could_backfill(need, runtime):
            return None
        end = self.now + runtime
        for reservation in self.held:
            if reservation.start < end:
                continue
            for nc in reservation.nodes:
                fit = fit_on(nc, need)
                if fit is not None:
                    self.cycle.take(fit, runtime)
                    return fit
        failed = self._failed.data.get(need)
        current = (self.cycle.cap.generation, len(self.held))
        shortest = runtime if failed is None or failed[:2] != current else min(failed[2], runtime)
        self._failed.put(need, (*current, shortest))
        return None

    def held_by(self, job_id: str) -> Reason | None:
        """The reason line of a job that holds a reservation, for its explanation."""
        for r in self.held:
            if r.job_id == job_id:
                names = ", ".join(nc.name for nc in r.nodes)
                when = (
                    "when their work ends"
                    if r.start == INF
                    else f"in ~{max(0.0, r.start - self.now):.0f}s"
                )
                text = f"nodes reserved for it: {names} (expected to fit {when})"
                return Reason(ReasonCode.HOLDS_RESERVATION, len(r.nodes), text)
        return None

    def _soonest(self, need: Need) -> list[tuple[float, int, int, NodeCap]]:
        """Candidate nodes rated by when ``need`` should fit there, soonest first."""
        feasible = set(self.cycle.feasible_classes(need))
        found: list[NodeCap] = []
        buckets = self.cycle.cap.everywhere.whole
        for level in range(len(buckets) - 1, 0, -1):
            found.extend(nc for nc in buckets[level] if nc.cls in feasible)
            if len(found) >= CANDIDATES:
                break
        if len(found) < CANDIDATES:
            found.extend(self._soonest_ending(feasible, {nc.idx for nc in found}))
        rated = [(self._fits_at(nc, need), -nc.whole_free, nc.idx, nc) for nc in found]
        rated.sort()  # as by the first three: node indices differ, so no node is compared
        return rated

    def _soonest_ending(self, feasible: set[int], seen: set[int]) -> list[NodeCap]:
        """Busy nodes (no free card) whose work should all end first: the rest of the candidates.

        The soonest (end, index) among the nodes whose end is the one the cycle started
        with, then this cycle's changes; only when too few nodes have a known end are all
        nodes walked (``_all_by_end``). One walk of the nodes' ends by index keeps the
        soonest found so far, a few: most nodes end later than the last of them and cost a
        comparison, where an order of every node's end was kept up to date between cycles
        (each start and end moved a node in a list of them) for the cycles that read it.
        """
        cycle, want = self.cycle, CANDIDATES - len(seen)
        nodes, changed = cycle.cap.nodes, cycle.changed_ends()
        ends: list[float] = []  # the soonest found so far, in (end, index) order ...
        found: list[int] = []  # ... and their nodes
        full, last = False, INF  # ``want`` found, and the end of the last of them
        started = cycle.started_ends()
        for idx, end in enumerate(started):
            # indices come in order: a node ending with the last kept one comes after it
            if end is None or (full and end >= last):
                continue
            if idx not in changed and _candidate(nodes[idx], feasible, seen):
                _keep(ends, found, end, idx, want)
                full = len(ends) == want
                last = ends[-1]
        if len(ends) < want:
            return self._all_by_end(feasible, seen)
        for idx, end in changed.items():
            if _candidate(nodes[idx], feasible, seen):
                _keep(ends, found, end, idx, want)
        return [nodes[idx] for idx in found]

    def _all_by_end(self, feasible: set[int], seen: set[int]) -> list[NodeCap]:
        """``_soonest_ending`` by walking every node (nodes with no known end come last)."""
        cycle = self.cycle
        ends: list[tuple[float, int]] = []
        for cls in feasible:
            for idx in cycle.class_members[cls]:
                nc = cycle.cap.nodes[idx]
                if idx in seen or nc.hidden or not nc.schedulable:
                    continue
                end = cycle.expected_end(idx)
                ends.append((INF if end is None else end, idx))
        ends.sort()
        return [cycle.cap.nodes[idx] for _, idx in ends[: CANDIDATES - len(seen)]]

    def _fits_at(self, nc: NodeCap, need: Need) -> float:
        """When ``need.gpus`` usable cards of ``nc`` should be free (``inf``: not known).

        Per card position, lists rather than sets and dicts of small ints: it rates up to
        ``CANDIDATES`` nodes per reservation, each card a few times."""
        now, count, cards = self.now, nc.gpu_count, nc.cards
        # ``usable`` None: every card is (no VRAM floor, no models named: the usual case)
        usable, free_at, wanted, known = _cards(nc, need, now) if need.picky else _all(cards, now)
        if wanted < need.gpus:
            return INF
        if known >= need.gpus:
            return now
        for alloc, end in self._work(nc.name):
            if alloc.on_cpu:
                continue
            when = INF if end is None else (end if end > now else now)
            for pos in nc.to_positions(alloc.gpu_indices):
                if (
                    pos < count
                    and (usable is None or usable[pos])
                    and cards[pos].free < MILLI
                    and free_at[pos] < when
                ):
                    if free_at[pos] == -INF:
                        known += 1
                    free_at[pos] = when
        if known < wanted:  # cards taken by this cycle's own placements
            node_end = self.cycle.expected_end(nc.idx)
            rest = INF if node_end is None else (node_end if node_end > now else now)
            for i in range(count):
                if (usable is None or usable[i]) and free_at[i] == -INF:
                    free_at[i] = rest
        return _nth(free_at, usable, need.gpus)


def _cards(nc: NodeCap, need: Need, now: float) -> tuple[list[bool] | None, list[float], int, int]:
    """Per card position of ``nc``: usable for ``need``, and when free (``now`` for a free
    card, -inf: not known yet); how many are usable, and how many of those are known."""
    usable = [nc.usable(i, need.vram, need.gpu_models) for i in range(nc.gpu_count)]
    free_at: list[float] = []
    wanted = known = 0
    for i, ok in enumerate(usable):
        if not ok:
            free_at.append(-INF)
            continue
        wanted += 1
        if nc.cards[i].free == MILLI:
            free_at.append(now)
            known += 1
        else:
            free_at.append(-INF)
    return usable, free_at, wanted, known


def _nth(free_at: list[float], usable: list[bool] | None, n: int) -> float:
    """The ``n``-th soonest (from 1) of the usable cards' times (``usable`` None: all)."""
    if usable is None:
        if n == len(free_at):  # the whole node: when its last card frees
            return max(free_at)
        free_at.sort()
        return free_at[n - 1]
    return sorted(free_at[i] for i in range(len(free_at)) if usable[i])[n - 1]


def _all(cards: list[Card], now: float) -> tuple[list[bool] | None, list[float], int, int]:
    """``_cards`` where every card is usable: no list of them (None), the same times."""
    free_at: list[float] = []
    known = 0
    for card in cards:
        if card.free == MILLI:
            free_at.append(now)
            known += 1
        else:
            free_at.append(-INF)
    return None, free_at, len(cards), known


def _keep(ends: list[float], found: list[int], end: float, idx: i64, want: i64) -> None:
    """Put node ``idx`` ending at ``end`` in its place among the ``want`` soonest found so
    far (``ends`` and ``found``, in (end, index) order), if it is one of them."""
    at: i64 = len(ends)
    while at > 0 and (ends[at - 1] > end or (ends[at - 1] == end and found[at - 1] > idx)):
        at -= 1
    if at >= want:
        return
    ends.insert(at, end)
    found.insert(at, idx)
    if len(ends) > want:
        ends.pop()
        found.pop()


def _candidate(nc: NodeCap, feasible: set[int], seen: set[int]) -> bool:
    """May ``nc`` be rated for a reservation (of a feasible class, shown, not yet rated)?"""
    return nc.cls in feasible and nc.idx not in seen and not nc.hidden and nc.schedulable
