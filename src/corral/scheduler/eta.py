"""Expected start and end times: when will a queued job start, a running one end.

``estimate(snapshot, config, durations, now)`` projects the queue forward on
a model of the cluster's cards: every GPU card is free from some time on
(now, or when the allocation holding it is expected to end, ``Durations``).
Queued jobs are taken in the scheduler's order (priority class, then users
round robin by weight, then age: ``queue_order``); each takes, on the nodes
that could run it, the cards that free up first, from the time its last one
is free, and holds them for its predicted run time. That is list scheduling
with backfill onto cards no earlier job claimed, as the scheduler places a
small job on a card a big job ahead cannot use. A job whose class may
preempt sees the cards of lower, preemptible work of its own team (or
borrowed work) as free once that work has run the minimum time before
preemption. A gang takes its replicas' cards on as many nodes at once.

What it does not know: work submitted later that will be served first (a
higher class, or a user with less service), retries and failures, nodes
joining, leaving or pausing, quota limits that hold a team back while cards
are idle, batching, models still to download, and the reservations for big
jobs beyond the cards this projection already gives them. Its error is
measured on a trace by ``bench/eta.py`` (docs/scheduler.md, "ETA").

Bounded: at most ``budget`` job x node checks per call; jobs past it get no
estimate. Pure: no I/O, ``now`` is an input.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from corral.core.model import EMPTY, Allocation, Job, Node, PriorityClass
from corral.core.resources import MILLI
from corral.scheduler.api import Config, Snapshot
from corral.scheduler.durations import Durations

BUDGET: Final = 1_000_000  # job x node checks per estimate: about a second at worst
CPU_MODEL: Final = "cpu"  # the GPU model history keys a node without GPUs by


@dataclass(frozen=True, slots=True)
class Eta:
    """When a job is expected to start (queued; None: running already, or no node could
    run it) and end, its predicted run time and what that rests on (``Durations``)."""

    job_id: str
    start_at: float | None
    end_at: float | None
    runtime_s: float
    basis: str
    position: int | None = None  # in the projection's order (queued jobs)


def estimate(
    snapshot: Snapshot,
    config: Config,
    durations: Durations,
    now: float,
    *,
    running: Mapping[str, Job] = EMPTY,
    budget: int = BUDGET,
) -> dict[str, Eta]:
    """An ``Eta`` per queued job (within ``budget``) and per job of an active allocation.
    ``running``: the running jobs' specs by id (kind, backend, model, estimate: the
    snapshot's allocations do not carry them); a job missing there is predicted from all
    history."""
    cluster = _Cluster(snapshot.nodes, config, now)
    etas = _running(snapshot.allocations, cluster, durations, running, now)
    for alloc in snapshot.allocations:
        if alloc.active:
            end = max((etas[j].end_at or now for j in alloc.job_ids if j in etas), default=now)
            cluster.hold(alloc, end)
    ranks = {c.name: c for c in config.priority_classes}
    left = budget
    for position, job in enumerate(queue_order(snapshot.queued, config)):
        if left <= 0:
            break
        left -= max(1, len(cluster.nodes))
        gpu = cluster.model_for(job)
        runtime, basis = durations.predict(job, gpu)
        start = cluster.place(job, ranks[job.priority], runtime, now)
        end = None if start is None else start + runtime
        etas[job.id] = Eta(job.id, start, end, runtime, basis, position)
    return etas


def queue_order(queued: Iterable[Job], config: Config) -> list[Job]:
    """``queued`` as the scheduler considers them: higher class first; inside a class
    each user's n-th job in round n (scaled by ``1 / weight``); then oldest first. Jobs of
    an unknown class are left out (the scheduler never places them)."""
    ranks = {c.name: c.rank for c in config.priority_classes}
    weights = config.user_weights
    seen: defaultdict[tuple[str, str], int] = defaultdict(int)
    keyed = []
    for job in sorted(queued, key=lambda j: (j.submitted_at, j.id)):
        rank = ranks.get(job.priority)
        if rank is None:
            continue
        turn = seen[job.priority, job.user]
        seen[job.priority, job.user] = turn + 1
        keyed.append(((-rank, turn / weights.get(job.user, 1.0), job.submitted_at, job.id), job))
    keyed.sort(key=lambda kj: kj[0])
    return [job for _, job in keyed]


def _running(
    allocations: Sequence[Allocation],
    cluster: _Cluster,
    durations: Durations,
    running: Mapping[str, Job],
    now: float,
) -> dict[str, Eta]:
    """The expected end of each job of an active allocation (a gang's once)."""
    etas: dict[str, Eta] = {}
    for alloc in allocations:
        if not alloc.active:
            continue
        gpu = cluster.model_of(alloc.node)
        elapsed = max(0.0, now - alloc.started_at)
        for job_id in alloc.job_ids:
            if job_id in etas:
                continue
            job = running.get(job_id) or Job(job_id)
            total, basis = durations.total(job, gpu, elapsed, alloc.progress)
            end = max(now, alloc.started_at + total)
            etas[job_id] = Eta(job_id, None, end, total, basis)
    return etas


@dataclass(slots=True)
class _Victim:
    """Preemptible work on a card, and from when it may be preempted."""

    rank: int
    team: str
    borrowed: bool
    at: float


class _Node:
    """One node's cards: from when each is free, and what preemptible work holds it."""

    __slots__ = ("free", "node", "victims")

    def __init__(self, node: Node, now: float) -> None:
        self.node = node
        self.free = [now] * len(node.gpus)
        self.victims: list[_Victim | None] = [None] * len(node.gpus)

    def ready(self, count: int, rank: int, team: str) -> float:
        """When ``count`` of its cards are free for a job of ``rank`` (its class may
        preempt: rank > 0) in ``team``."""
        if rank <= 0:
            return sorted(self.free)[count - 1]
        times = [
            t if v is None or not _may_evict(v, rank, team) else min(t, v.at)
            for t, v in zip(self.free, self.victims, strict=True)
        ]
        return sorted(times)[count - 1]

    def claim(self, count: int, start: float, until: float, share: int) -> None:
        """Hold the ``count`` cards that free up first from ``start`` to ``until`` (a
        share of one card: that card for the share's part of the time)."""
        order = sorted(range(len(self.free)), key=self.free.__getitem__)
        for i in order[:count]:
            if share:
                self.free[i] = max(self.free[i], start) + (until - start) * share / MILLI
            else:
                self.free[i] = until
            self.victims[i] = None


def _may_evict(victim: _Victim, rank: int, team: str) -> bool:
    return victim.rank < rank and (victim.borrowed or victim.team == team)


class _Cluster:
    """The card model the queue is projected on."""

    def __init__(self, nodes: Sequence[Node], config: Config, now: float) -> None:
        self.nodes = [_Node(n, now) for n in nodes if n.schedulable and n.gpus]
        self._by_name = {n.node.name: n for n in self.nodes}
        self._models = {n.name: n.gpus[0].model if n.gpus else CPU_MODEL for n in nodes}
        self._classes = {c.name: c for c in config.priority_classes}
        self._preemption = config.preemption
        self._min_run = config.min_runtime_before_preemption_s
        self._now = now

    def model_of(self, node: str) -> str:
        return self._models.get(node, "")

    def model_for(self, job: Job) -> str:
        """The GPU model a queued job will most likely run on: its only allowed one, else
        the most common among nodes (history keyed by it)."""
        allowed = job.resources.gpu_models
        if len(allowed) == 1:
            return next(iter(allowed))
        if not job.resources.gpus and not job.resources.gpu_milli:
            return CPU_MODEL
        models = [n.node.gpus[0].model for n in self.nodes]
        return max(set(models), key=models.count) if models else ""

    def hold(self, alloc: Allocation, end: float) -> None:
        """Cards of a running allocation are busy until its expected end."""
        node = self._by_name.get(alloc.node)
        if node is None or alloc.on_cpu:
            return
        victim = self._victim(alloc)
        for i in alloc.gpu_indices:
            if i >= len(node.free):
                continue
            if alloc.gpu_milli >= MILLI:
                node.free[i] = max(node.free[i], end)
            else:  # a share: the card is busy for that share of the time
                node.free[i] = max(node.free[i], self._now) + (end - self._now) * (
                    alloc.gpu_milli / MILLI
                )
            node.victims[i] = victim

    def _victim(self, alloc: Allocation) -> _Victim | None:
        cls = self._classes.get(alloc.priority)
        if not self._preemption or not alloc.preemptible or cls is None or not cls.preemptible:
            return None
        at = max(self._now, alloc.started_at + self._min_run)
        return _Victim(cls.rank, alloc.team, alloc.borrowed, at)

    def place(self, job: Job, cls: PriorityClass, runtime: float, now: float) -> float | None:
        """The projected start of ``job`` (its cards then held), None: no node could."""
        earliest = max(now, job.not_before)
        res = job.resources
        if not res.gpus and not res.gpu_milli and not res.vram_bytes:
            return earliest  # CPU only: cores are rarely what work waits for
        count = res.gpus or 1
        rank = cls.rank if cls.can_preempt and self._preemption else 0
        ready = sorted(
            (node.ready(count, rank, job.team), k)
            for k, node in enumerate(self.nodes)
            if _fits(job, node.node, count)
        )
        if len(ready) < job.replicas:
            return None
        chosen = ready[: job.replicas]
        start = max(earliest, chosen[-1][0])
        share = 0 if res.gpus else (res.gpu_milli or MILLI)
        for _, k in chosen:
            self.nodes[k].claim(count, start, start + runtime, share)
        return start


def _fits(job: Job, node: Node, count: int) -> bool:
    """Could ``node`` ever run one replica of ``job`` (its cards, models, labels, backend)."""
    res = job.resources
    if len(node.gpus) < count or node.name in job.lacking_nodes:
        return False
    card = node.gpus[0]
    if res.gpu_models and card.model not in res.gpu_models:
        return False
    if res.vram_bytes and card.vram_bytes < res.vram_bytes:
        return False
    if job.backend is not None and node.backends and job.backend not in node.backends:
        return False
    labels = node.labels
    return all(labels.get(k) == v for k, v in job.node_selector.items())
