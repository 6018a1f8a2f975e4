"""Plain first-fit and best-fit placement: the baselines corral is measured against.

Both have the shape of ``corral.scheduler.schedule`` so the simulator runs
them the same way. They are deliberately plain: jobs in priority order, then
oldest first, each placed greedily where it fits (a job that does not fit is
skipped, so smaller ones behind it still run); no quotas, no fairness, no
preemption, no batching. Gangs are all or nothing (tried on a working copy,
undone when a replica does not fit), because a partial gang is not a
placement at all.

* first fit: the first node in cluster order that fits;
* best fit: the node left with the fewest whole free GPUs (the tightest
  fit), first in cluster order among equals; a shared-GPU job takes the
  card with the least free share that fits.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Mapping
from dataclasses import dataclass

from corral.core.model import Job, Node
from corral.core.resources import MILLI, MILLI_CPU, ResourceRequest, cpu_milli
from corral.scheduler.api import Config, Placement, Plan, Reason, ReasonCode, Remedy, Snapshot
from corral.scheduler.api import Unplaced as UnplacedJob


def first_fit(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
    """Place each queued job on the first node that fits."""
    return _Greedy(snapshot, best=False).plan(config)


def best_fit(snapshot: Snapshot, config: Config, now: float, seed: int) -> Plan:
    """Place each queued job on the node it fills the most."""
    return _Greedy(snapshot, best=True).plan(config)


@dataclass(frozen=True, slots=True)
class _Static:
    """What never changes about the nodes: computed once per nodes tuple."""

    index: Mapping[str, int]
    group: tuple[str | None, ...]  # the node's GPU model (None: mixed or no GPUs)
    card_vram: tuple[tuple[int, ...], ...]
    labels: tuple[Mapping[str, str], ...]
    schedulable: tuple[int, ...]  # indices of the nodes that take new work
    gpu_count: tuple[int, ...]
    cpus: tuple[int, ...]  # milli-CPUs
    memory: tuple[int, ...]  # bytes
    max_gpus: int
    all_free: tuple[list[int], ...]  # templates: never mutated, copied on write
    card_vram_lists: tuple[list[int], ...]  # the same for VRAM


_cache: dict[int, tuple[tuple[Node, ...], _Static]] = {}


def _static(nodes: tuple[Node, ...]) -> _Static:
    """Memoised per nodes tuple (the simulator passes the same tuple every cycle)."""
    hit = _cache.get(id(nodes))
    if hit is not None and hit[0] is nodes:
        return hit[1]
    models = [{g.model for g in n.gpus} for n in nodes]
    static = _Static(
        index={n.name: i for i, n in enumerate(nodes)},
        group=tuple(next(iter(m)) if len(m) == 1 else None for m in models),
        card_vram=tuple(tuple(g.vram_bytes for g in n.gpus) for n in nodes),
        labels=tuple(n.labels for n in nodes),
        schedulable=tuple(i for i, n in enumerate(nodes) if n.schedulable),
        gpu_count=tuple(len(n.gpus) for n in nodes),
        cpus=tuple(cpu_milli(n.cpus) for n in nodes),
        memory=tuple(n.memory_bytes for n in nodes),
        max_gpus=max((len(n.gpus) for n in nodes), default=0),
        all_free=tuple([MILLI] * len(n.gpus) for n in nodes),
        card_vram_lists=tuple([g.vram_bytes for g in n.gpus] for n in nodes),
    )
    _cache.clear()
    _cache[id(nodes)] = (nodes, static)
    return static


# node, GPUs, milli per GPU, vram, milli-CPUs, memory bytes
Pick = tuple[int, tuple[int, ...], int, int, int, int]


class _Greedy:
    """Free capacity of one snapshot, indexed by whole free GPUs per node.

    Built in O(nodes + allocations) with cheap steps: a node's free lists are
    shared templates until an allocation or a pick changes them.
    """

    def __init__(self, snapshot: Snapshot, *, best: bool) -> None:
        self.snapshot, self.best = snapshot, best
        st = self.st = _static(snapshot.nodes)
        # Copy on write: a node's lists are the shared all-free templates until changed.
        free = self.free = list(st.all_free)
        vram = self.vram = list(st.card_vram_lists)
        cpu = self.cpu = list(st.cpus)
        mem = self.mem = list(st.memory)
        index, templates = st.index, st.all_free
        shared = set()
        for a in snapshot.allocations:
            i = index[a.node]
            milli = a.gpu_milli
            node_free = free[i]
            if node_free is templates[i]:
                node_free = free[i] = node_free[:]
            for g in a.gpu_indices:
                node_free[g] -= milli
            if milli < MILLI:
                shared.add(i)
                if a.vram_bytes:
                    self._own_vram(i)
                    for g in a.gpu_indices:
                        vram[i][g] -= a.vram_bytes
            cpu[i] -= cpu_milli(a.cpus)
            mem[i] -= a.memory_bytes
        whole = self.whole = list(st.gpu_count)
        for i, node_free in enumerate(free):
            if node_free is not templates[i]:
                whole[i] = node_free.count(MILLI)
        self.partial = [i for i in sorted(shared) if _has_partial(free[i])]  # cluster order
        self.groups: dict[str | None, list[list[int]]] = {}
        group = st.group
        for i in st.schedulable:
            buckets = self.groups.get(group[i])
            if buckets is None:
                buckets = self.groups[group[i]] = [[] for _ in range(st.max_gpus + 1)]
            buckets[whole[i]].append(i)

    def _own_vram(self, i: int) -> None:
        if self.vram[i] is self.st.card_vram_lists[i]:
            self.vram[i] = self.vram[i][:]

    def plan(self, config: Config) -> Plan:
        ranks = {c.name: c.rank for c in config.priority_classes}
        order = sorted(
            self.snapshot.queued, key=lambda j: (-ranks.get(j.priority, 0), j.submitted_at)
        )
        placements: list[Placement] = []
        unplaced: list[UnplacedJob] = []
        failed: set[tuple[object, ...]] = set()  # shapes that did not fit: later ones won't
        for position, job in enumerate(order):
            # Equal requests are usually one interned object; id() keys are cheap to hash
            # and stay valid while the snapshot holds the jobs.
            shape = (id(job.resources), job.replicas, tuple(job.node_selector.items()))
            picks = None if shape in failed else self._place(job)
            if picks is None:
                failed.add(shape)
                unplaced.append(_unplaced(job, position))
                continue
            for replica, (i, gpus, milli, vram, cpus, memory) in enumerate(picks):
                placements.append(
                    Placement(
                        allocation_id=f"{job.id}:{job.attempt + 1}:{replica}",
                        job_ids=(job.id,),
                        node=self.snapshot.nodes[i].name,
                        replica=replica,
                        gpu_indices=gpus,
                        gpu_milli=milli,
                        vram_bytes=vram,
                        cpus=cpus / MILLI_CPU,
                        memory_bytes=memory,
                    )
                )
        return Plan(placements=tuple(placements), unplaced=tuple(unplaced))

    def _place(self, job: Job) -> list[Pick] | None:
        """All replicas, or none (undo the ones taken when one does not fit)."""
        picks: list[Pick] = []
        for _ in range(job.replicas):
            pick = self._find(job.resources, job.node_selector)
            if pick is None:
                for taken in picks:
                    self._move(taken, sign=+1)
                return None
            self._move(pick, sign=-1)
            picks.append(pick)
        return picks

    def _find(self, r: ResourceRequest, selector: Mapping[str, str]) -> Pick | None:
        if r.gpus:
            return self._find_whole(r, selector)
        if r.shared:
            return self._find_shared(r, selector)
        return self._find_cpu(r, selector)

    def _find_whole(self, r: ResourceRequest, selector: Mapping[str, str]) -> Pick | None:
        found: tuple[int, int] | None = None  # (sort key, node)
        fits = self._fits_whole
        for buckets in self._groups_for(r):
            for k in range(r.gpus, len(buckets)):
                for i in buckets[k]:
                    key = k * 1_000_000 + i if self.best else i
                    if found is not None and key >= found[0]:
                        break  # buckets are in cluster order: nothing better further on
                    if fits(i, r, selector):
                        found = (key, i)
                        break
                if self.best and found is not None:
                    break  # later buckets of this group hold only looser fits
        if found is None:
            return None
        i = found[1]
        if r.vram_bytes or r.gpu_models:
            cards = [g for g in range(len(self.free[i])) if self._card_free(i, g, r)]
        else:
            cards = [g for g, f in enumerate(self.free[i]) if f == MILLI]
        return (i, tuple(cards[: r.gpus]), MILLI, 0, r.cpu_milli, r.memory_bytes)

    def _find_shared(self, r: ResourceRequest, selector: Mapping[str, str]) -> Pick | None:
        """A partly used card that fits (tightest for best fit), else a fresh one."""
        choice: tuple[int, int, int, int] | None = None  # (key, node, gpu, milli)
        for i in self.partial:
            for g, f in enumerate(self.free[i]):
                milli = r.milli_on(self.st.card_vram[i][g])
                if 0 < f < MILLI and self._fits_card(i, g, milli, r, selector):
                    key = f - milli if self.best else i
                    if choice is None or key < choice[0]:
                        choice = (key, i, g, milli)
            if choice is not None and not self.best:
                break
        if choice is None:
            whole = ResourceRequest(
                gpus=1, cpus=r.cpus, gpu_models=r.gpu_models, memory_bytes=r.memory_bytes
            )
            pick = self._find_whole(whole, selector)
            if pick is None:
                return None
            i, g = pick[0], pick[1][0]
            choice = (0, i, g, r.milli_on(self.st.card_vram[i][g]))
            if self.vram[i][g] < r.vram_bytes:
                return None
        _, i, g, milli = choice
        return (i, (g,), milli, r.vram_bytes, r.cpu_milli, r.memory_bytes)

    def _find_cpu(self, r: ResourceRequest, selector: Mapping[str, str]) -> Pick | None:
        fits = [
            (self.cpu[i] if self.best else i, i)
            for i in self.st.schedulable
            if self.cpu[i] >= r.cpu_milli
            and self.mem[i] >= r.memory_bytes
            and _matches(self.st.labels[i], selector)
        ]
        return (min(fits)[1], (), 0, 0, r.cpu_milli, r.memory_bytes) if fits else None

    def _groups_for(self, r: ResourceRequest) -> list[list[list[int]]]:
        """The bucket lists of the node groups whose GPU model suits ``r``."""
        return [
            buckets
            for group, buckets in self.groups.items()
            if not r.gpu_models or group is None or group in r.gpu_models
        ]

    def _fits_whole(self, i: int, r: ResourceRequest, selector: Mapping[str, str]) -> bool:
        if self.cpu[i] < r.cpu_milli or self.mem[i] < r.memory_bytes:
            return False
        if selector and not _matches(self.st.labels[i], selector):
            return False
        if not r.vram_bytes and (not r.gpu_models or self.st.group[i] is not None):
            return True
        usable = sum(1 for g in range(len(self.free[i])) if self._card_free(i, g, r))
        return usable >= r.gpus

    def _card_free(self, i: int, g: int, r: ResourceRequest) -> bool:
        """Card ``g`` of node ``i`` is wholly free and suits ``r``."""
        return (
            self.free[i][g] == MILLI
            and self.st.card_vram[i][g] >= r.vram_bytes
            and (not r.gpu_models or self.snapshot.nodes[i].gpus[g].model in r.gpu_models)
        )

    def _fits_card(
        self, i: int, g: int, milli: int, r: ResourceRequest, selector: Mapping[str, str]
    ) -> bool:
        model = self.snapshot.nodes[i].gpus[g].model
        return (
            self.free[i][g] >= milli
            and self.vram[i][g] >= r.vram_bytes
            and self.cpu[i] >= r.cpu_milli
            and self.mem[i] >= r.memory_bytes
            and (not r.gpu_models or model in r.gpu_models)
            and _matches(self.st.labels[i], selector)
        )

    def _move(self, pick: Pick, *, sign: int) -> None:
        """Take (sign -1) or give back (+1) a pick, keeping the indexes current."""
        i, gpus, milli, vram, cpus, memory = pick
        free = self.free[i]
        if free is self.st.all_free[i]:
            free = self.free[i] = free[:]
        if vram:
            self._own_vram(i)
        for g in gpus:
            free[g] += sign * milli
            self.vram[i][g] += sign * vram
        self.cpu[i] += sign * cpus
        self.mem[i] += sign * memory
        after = free.count(MILLI)
        if after != self.whole[i]:
            buckets = self.groups[self.st.group[i]]
            buckets[self.whole[i]].remove(i)
            insort(buckets[after], i)
            self.whole[i] = after
        partial = _has_partial(free)
        if partial and i not in self.partial:
            insort(self.partial, i)
        elif not partial and i in self.partial:
            self.partial.remove(i)


def _has_partial(free: list[int]) -> bool:
    return any(0 < f < MILLI for f in free)


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _unplaced(job: Job, position: int) -> UnplacedJob:
    reason = Reason(ReasonCode.INSUFFICIENT_GPUS, 0, "no node has room for it now")
    return UnplacedJob(job.id, position, (reason,), Remedy.WAIT)
