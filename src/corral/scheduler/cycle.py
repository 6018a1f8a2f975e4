"""A cycle's working state on a ``Cluster`` (``cluster.py``): capacity, caches, ends.

``Cycle`` is one cycle on a cluster. It answers one question fast: where does
this need fit best right now (``find``), and records the answer (``take``)
on the working copy of capacity, which supports checkpoint/rollback for
what-ifs. Every change it makes is journaled, so the cycle as a whole can be
rolled back (``Scheduler`` does, to start the next cycle from the world's
state rather than from its own plan).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

from corral.core.model import Allocation
from corral.core.resources import cpu_milli
from corral.scheduler.api import Config, Snapshot
from corral.scheduler.cluster import Cluster, node_ends
from corral.scheduler.fit import Fit, Source, search
from corral.scheduler.need import Need
from corral.scheduler.node_cap import ABSENT, LOADED, ON_DISK, NodeCap
from corral.scheduler.scorers import (
    DEFAULT_SCORERS,
    TIGHTEST_FIRST_SCORERS,
    Candidate,
    Scorer,
    choose,
    default_total,
    fixed_weights,
    weighted,
)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_MISSING: Final = object()
Mark = tuple[tuple[int, int], int]
"""A capacity mark and a memo-log length: what ``Cycle.rollback`` returns to."""

FEW_CLASSES: Final = 8
"""Up to this many feasible classes, walk their own indexes; past it, walk the
overall index and skip other classes (cheaper than many nearly empty buckets)."""


def current(stamp: int | None, generation: int) -> bool:
    """Is a memo's capacity stamp (``None``: no entry) this ``generation``? A failure
    noted before capacity last changed says nothing now."""
    return stamp is not None and stamp == generation


class Memo(Generic[K, V]):
    """A cache whose writes are undone by ``Cycle.rollback`` (what-ifs leave no trace)."""

    def __init__(self, log: list[tuple[Any, Any, Any]]) -> None:
        self._data: dict[K, V] = {}
        self.log = log  # the log it writes to (``Cycle.rollback`` undoes it; a ``quota.Ledger``
        # writes its changes there too)
        self.get = self._data.get
        self.data = self._data  # read-only: writes go through ``put``, which logs them

    def put(self, key: K, value: V) -> None:
        self.log.append((self._data, key, self._data.get(key, _MISSING)))
        self._data[key] = value


class Cycle:
    """Working state of one cycle. Not thread-safe; not reused across cycles.

    ``source`` is a snapshot (a throwaway cluster is built from it) or a kept
    ``Cluster``; ``ends`` gives, per node index, when its running work should
    all have ended (from ``Snapshot.expected_ends``), when that is known;
    ``end_at``, the same ends as a list by node index (``None`` where unknown) when the
    caller keeps one (then ``ends`` is not read; made from ``ends`` otherwise).
    """

    def __init__(
        self,
        source: Snapshot | Cluster,
        config: Config,
        now: float,
        scorers: Sequence[Scorer] = DEFAULT_SCORERS,
        ends: Mapping[int, float] | None = None,
        end_at: list[float | None] | None = None,
    ) -> None:
        if isinstance(source, Snapshot):
            cluster = Cluster.of(source)
            ends = node_ends(cluster.cap, source.allocations, source.expected_ends)
        else:
            cluster = source
        self.cluster = cluster
        self.config = config
        self.now = now
        self._chain = weighted(scorers, config.scorer_weights)
        self._fixed = fixed_weights(self._chain)
        self._tightest_wins = all(isinstance(s, TIGHTEST_FIRST_SCORERS) for _, s in self._chain)
        self.cap = cluster.cap
        self.checks = cluster.checks
        self.representatives = cluster.representatives
        self.class_members = cluster.class_members
        self._sources = cluster.sources
        self._plain_sources = cluster.plain_sources
        self._feasible = cluster.feasible
        # (where, key, old value): a memo's dict or a ``quota.TeamBudget``, each written
        # back by an item store
        self._memo_log: list[tuple[Any, Any, Any]] = []
        self._failed: Memo[Need, int] = self.memo()
        if end_at is None:
            end_at = _by_index(dict(ends or {}), len(cluster.cap.nodes))
        self._base_at = end_at  # node index -> when its work should all end, at the start
        self._ends: Memo[int, float] = self.memo()  # node -> when its work should all end
        self._end_data = self._ends.data
        # by node index: may ``_ends`` hold it (set by a change, left by a rollback: then the
        # map says no)
        self._moved: list[bool] = []
        self.start = self.checkpoint()

    def hold(self, alloc: Allocation) -> None:
        """Count an existing allocation against its node's capacity."""
        nc = self.cap.by_name.get(alloc.node)
        if nc is not None:
            gpus = () if alloc.on_cpu else nc.to_positions(alloc.gpu_indices)
            cpus, memory = cpu_milli(alloc.cpus), alloc.memory_bytes
            self.cap.reserve(nc, gpus, alloc.gpu_milli, alloc.vram_bytes, cpus, memory)

    def unhold(self, alloc: Allocation) -> None:
        """Give an allocation's capacity back (a preemption, on the working copy)."""
        nc = self.cap.by_name.get(alloc.node)
        if nc is not None:
            gpus = () if alloc.on_cpu else nc.to_positions(alloc.gpu_indices)
            cpus, memory = cpu_milli(alloc.cpus), alloc.memory_bytes
            self.cap.release(nc, gpus, alloc.gpu_milli, alloc.vram_bytes, cpus, memory)

    def failed(self, need: Need) -> bool:
        """``find(need)`` is known to find nothing now (a memo hit)."""
        return current(self._failed.data.get(need), self.cap.generation)

    def find(
        self,
        need: Need,
        model: str | None,
        runtime: float | None = None,
        avoid: frozenset[str] = frozenset(),
        exclude: frozenset[str] = frozenset(),
    ) -> Fit | None:
        """The best place for ``need`` now, or ``None`` (cached until capacity grows).

        ``runtime``: the job's estimated run time, when known (end-together scoring).
        ``avoid``: nodes to pass over while the need fits anywhere else (where a job's
        earlier attempts failed); where nothing else fits, they are used all the same.
        That a need fits at all does not depend on ``avoid``, so the memo holds.
        ``exclude``: nodes never to use (their backend lacks a model the job needs); a
        need that fits only there is not remembered as failed: other jobs may go there.
        """
        if current(self._failed.data.get(need), self.cap.generation):
            return None
        limit = self.config.candidates_per_tier
        if model is None and runtime is None and self._tightest_wins and not need.cpu_only:
            limit = 1  # no locality, no end time: the best-fit order is the score order
        chosen: Fit | None = None
        passed = self.cap.by_name
        banned = {passed[n].idx for n in exclude if n in passed} if exclude else None
        if avoid:
            skip = {passed[n].idx for n in avoid if n in passed}
            chosen = self._choose(need, model, runtime, limit, skip | banned if banned else skip)
        if chosen is None:
            chosen = self._choose(need, model, runtime, limit, set(banned) if banned else None)
        if chosen is None and not banned:
            self._failed.put(need, self.cap.generation)
        return chosen

    def _choose(
        self,
        need: Need,
        model: str | None,
        runtime: float | None,
        limit: int,
        seen: set[int] | None,
    ) -> Fit | None:
        """``choose`` among up to ``limit`` fits per tier (nodes in ``seen`` passed over);
        None: no fit. With the default chain, each fit is scored as it comes, no
        ``Candidate`` made for it, and a lone fit is not scored (as ``choose`` does)."""
        fixed = self._fixed
        if fixed is None:
            candidates = self._candidates(need, model, runtime, limit, seen)
            return choose(need, candidates, self._chain) if candidates else None
        tiers = self._tiers(need, model)
        seen = _seen(tiers, seen)
        first: Fit | None = None
        first_locality, first_gap = ABSENT, None
        best: Fit | None = None
        best_score = -math.inf
        for sources in tiers:
            for fit in search(need, sources, limit, seen):
                place, gap = locality(fit.node, model), self._end_gap(fit.node, runtime)
                if first is None:
                    first, first_locality, first_gap = fit, place, gap
                    continue
                if best is None:  # a second fit: the first is scored now; it leads ties
                    best = first
                    score = default_total(need, first, first_locality, first_gap, fixed)
                    if score > best_score:
                        best_score = score
                score = default_total(need, fit, place, gap, fixed)
                if score > best_score:
                    best, best_score = fit, score
        return first if best is None else best

    def _candidates(
        self,
        need: Need,
        model: str | None,
        runtime: float | None,
        limit: int,
        seen: set[int] | None,
    ) -> list[Candidate]:
        """Up to ``limit`` fits per tier, nodes in ``seen`` (None: none) passed over."""
        candidates: list[Candidate] = []
        tiers = self._tiers(need, model)
        seen = _seen(tiers, seen)
        for sources in tiers:
            for fit in search(need, sources, limit, seen):
                gap = self._end_gap(fit.node, runtime)
                candidates.append(Candidate(fit, locality(fit.node, model), gap))
        return candidates

    def _end_gap(self, nc: NodeCap, runtime: float | None) -> float | None:
        """How far apart this job's end and the node's expected end are, in [0, 1]."""
        if runtime is None:
            return None
        node_end = self.expected_end(nc.idx)
        if node_end is None:
            return None
        job_end = self.now + runtime
        span = max(node_end, job_end) - self.now
        return abs(node_end - job_end) / span if span > 0 else 0.0

    def memo(self) -> Memo[Any, Any]:
        """A new cache that rolls back with the working copy."""
        return Memo(self._memo_log)

    def checkpoint(self) -> Mark:
        """Start a what-if: capacity and every memo can return here."""
        return (self.cap.checkpoint(), len(self._memo_log))

    def rollback(self, mark: Mark) -> None:
        """Undo capacity changes and memo writes made since ``mark``."""
        self.cap.rollback(mark[0])
        log = self._memo_log
        while len(log) > mark[1]:
            data, key, old = log.pop()
            if old is _MISSING:
                del data[key]
            else:
                data[key] = old

    def node(self, name: str) -> NodeCap | None:
        return self.cap.by_name.get(name)

    def take(self, fit: Fit, runtime: float | None = None) -> None:
        """Reserve ``fit`` on the working copy (and note when it should end, if known)."""
        self.cap.reserve(fit.node, fit.gpus, fit.milli, fit.vram, fit.cpus, fit.memory)
        if runtime is not None:
            self._expect_end(fit.node.idx, self.now + runtime)

    def expected_end(self, idx: int) -> float | None:
        """When node ``idx``'s work should all have ended (None: unknown), as of this cycle."""
        moved = self._moved
        if moved and moved[idx]:  # this cycle moved this node's end (few do)
            end = self._end_data.get(idx)
            if end is not None:
                return end
        return self._base_at[idx]

    def started_ends(self) -> list[float | None]:
        """Each node's expected end as the cycle started, by node index (None: unknown;
        not to be changed)."""
        return self._base_at

    def changed_ends(self) -> dict[int, float]:
        """The nodes whose expected end this cycle moved (its placements, bookings), with
        their end now; every other node's is its entry in ``started_ends``."""
        return self._end_data

    def book(self, idx: int, end: float) -> None:
        """Note that node ``idx`` is spoken for until ``end`` (a job waiting for it; undone
        by ``rollback`` like everything else)."""
        self._expect_end(idx, end)

    def _expect_end(self, idx: int, end: float) -> None:
        old = self.expected_end(idx)
        if old is None or end > old:
            if not self._moved:
                self._moved = [False] * len(self._base_at)
            self._moved[idx] = True
            self._ends.put(idx, end)

    def feasible_classes(self, need: Need) -> list[int]:
        """Classes of schedulable nodes that pass every static filter for ``need``."""
        cached = self._feasible.get(need)
        if cached is None:
            cached = [c for c in self.cap.classes() if self.checks.reason(need, c) is None]
            self._feasible[need] = cached
        return cached

    def _tiers(self, need: Need, model: str | None) -> list[list[Source]]:
        """Where to look, best locality first: model holders, then everything feasible."""
        cached = (
            self._plain_sources.get(need) if model is None else self._sources.get((need, model))
        )
        if cached is not None:
            return cached
        feasible = self.feasible_classes(need)
        tiers: list[list[Source]] = []
        if feasible:
            every = len(feasible) == len(self.cap.by_class)
            allowed = None if every else frozenset(feasible)
            if model is not None and not need.cpu_only:
                for level in (LOADED, ON_DISK):
                    holders = self.cap.by_model.get((model, level))
                    if holders is not None:
                        tiers.append([Source(holders, allowed)])
            tiers.append(self._main_sources(need, feasible, allowed))
        if model is None:
            self._plain_sources[need] = tiers
        else:
            self._sources[(need, model)] = tiers
        return tiers

    def _main_sources(
        self, need: Need, feasible: list[int], allowed: frozenset[int] | None
    ) -> list[Source]:
        by_class = self.cap.by_class
        if need.cpu_only:  # GPU-less nodes first, then nodes with fewer cards
            ordered = sorted(feasible, key=lambda c: (self.representatives[c].gpus.__len__(), c))
            return [Source(by_class[c]) for c in ordered]
        if allowed is None:
            return [Source(self.cap.everywhere)]
        if len(feasible) <= FEW_CLASSES:
            return [Source(by_class[c]) for c in feasible]
        return [Source(self.cap.everywhere, allowed)]


def _by_index(ends: dict[int, float], nodes: int) -> list[float | None]:
    """``ends`` as a list by node index (``nodes`` long, or to the last index ``ends``
    names), ``None`` where a node has no known end."""
    out: list[float | None] = [None] * max(nodes, max(ends, default=-1) + 1)
    for idx, end in ends.items():
        out[idx] = end
    return out


def _seen(tiers: list[list[Source]], seen: set[int] | None) -> set[int] | None:
    """The nodes a search passes over: ``seen``, or a new set when there is none and a
    later tier must not list a node again."""
    return set() if seen is None and len(tiers) > 1 else seen


def locality(nc: NodeCap, model: str | None) -> int:
    """How close ``nc`` is to having ``model`` ready: loaded, on disk, or absent."""
    if model is None:
        return ABSENT
    node = nc.node
    if model in node.models_loaded:
        return LOADED
    return ON_DISK if model in node.models_on_disk else ABSENT
