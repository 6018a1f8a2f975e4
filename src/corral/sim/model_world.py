"""Simulate models on nodes: which model each GPU holds, disk caches, downloads, swaps.

The main simulator (``world.py``) counts GPUs; this one adds what dominates
image and language serving: a job can only start computing once its model
is in its node's GPU memory. Each node has one GPU that holds one model, a
disk cache of ``cache_models`` x the mean model size (least recently used
models evicted), and a network link. Starting a job on a node costs:

    model loaded on that GPU      0
    on the node's disk            size / load rate            (a "swap")
    not on the node               size / fetch rate + load    (a download and a swap)

The node is held by the job during that time. The same pure ``schedule``
decides in both modes; they differ only in what it is told:

* ``aware``: nodes report their models (loaded, on disk), the registry's
  sizes and the fetch/load rates are in the snapshot and config (so the
  scheduler prefers nodes with the model and may wait for one), and the
  prefetch policy (``plan_prefetch``) copies popular models to idle nodes;
* ``locality``: nodes report their models, but nothing else: the scorers
  prefer nodes with the model among those free now, never wait, no prefetch;
* ``blind``: nodes report no models: routing ignores them.

Everything is seeded and event-driven (no sleeping): ``run(workload, mode)``
returns ``ModelRunReport`` with swaps and downloads per job and wait times
(submission to the start of computing, start-up included).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from corral.core.model import Allocation, Gpu, Job, Node
from corral.core.resources import GIB, ResourceRequest
from corral.core.states import AllocObserved
from corral.scheduler import Config, Scheduler, Snapshot, schedule
from corral.scheduler.prefetch import CacheState, PrefetchConfig, plan_prefetch

Mode = Literal["aware", "locality", "blind"]
MODES: tuple[Mode, ...] = ("aware", "locality", "blind")
POPULARITY_HALF_S = 300.0
"""Recent demand (for the prefetch policy) halves every five minutes."""


@dataclass(frozen=True, slots=True)
class ModelWorkload:
    """A seeded workload: users submitting jobs that each name one of ``models`` models."""

    jobs: int = 4000
    users: int = 60
    models: int = 20
    nodes: int = 16
    zipf_s: float = 1.1  # popularity of the k-th model ~ 1 / k**s
    size_gb: tuple[float, float] = (2.0, 7.0)  # model sizes, uniform in this range (GB)
    work_s: float = 12.0  # mean compute time of a job (exponential, at least 1 s)
    load: float = 0.7  # arrival rate as a share of what the GPUs could compute
    cache_models: float = 4.0  # disk cache per node, in mean model sizes
    fetch_bytes_per_s: float = 200e6  # each node's download rate
    load_bytes_per_s: float = 1e9  # disk to GPU memory
    prefetch_every_s: float = 10.0
    window: int = 256  # the oldest queued jobs each cycle considers (at most `nodes` start)
    seed: int = 0


@dataclass
class ModelRunReport:
    mode: str
    jobs: int
    swaps: int = 0
    downloads: int = 0
    prefetches: int = 0
    waits: list[float] = field(default_factory=list)  # per job: submit -> compute starts
    startup_s: float = 0.0  # GPU time spent loading and downloading
    busy_s: float = 0.0  # GPU time spent computing
    end: float = 0.0

    def summary(self) -> dict[str, float]:
        waits = sorted(self.waits)
        return {
            "jobs": self.jobs,
            "swaps_per_job": self.swaps / max(1, self.jobs),
            "downloads_per_job": self.downloads / max(1, self.jobs),
            "prefetches": self.prefetches,
            "wait_p50_s": _pct(waits, 0.50),
            "wait_p95_s": _pct(waits, 0.95),
            "startup_share": self.startup_s / max(1e-9, self.startup_s + self.busy_s),
            "makespan_s": self.end,
        }


@dataclass
class _Node:
    name: str
    budget: int
    disk: OrderedDict[str, int] = field(default_factory=OrderedDict)  # LRU order, newest last
    loaded: str | None = None
    job: str | None = None
    fetching: dict[str, float] = field(default_factory=dict)  # prefetch: model -> done at


@dataclass(frozen=True, slots=True)
class _Arrival:
    job: Job
    work: float


def run(w: ModelWorkload, mode: Mode) -> ModelRunReport:
    """Replay ``w`` with model-aware (``aware``) or model-blind (``blind``) routing."""
    return _Sim(w, mode).loop()


class _Sim:
    def __init__(self, w: ModelWorkload, mode: Mode) -> None:
        self.w, self.mode = w, mode
        rng = random.Random(w.seed)
        names = [f"model-{k:02d}" for k in range(w.models)]
        self.sizes = {n: int(rng.uniform(*w.size_gb) * 1e9) for n in names}
        mean = sum(self.sizes.values()) / len(self.sizes)
        self.nodes = [_Node(f"gpu-{i:02d}", int(w.cache_models * mean)) for i in range(w.nodes)]
        self.events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, id)
        self.seq = 0
        self.queued: dict[str, Job] = {}
        self.work: dict[str, float] = {}
        self.allocs: dict[str, Allocation] = {}
        self.ends: dict[str, float] = {}
        self.report = ModelRunReport(mode, w.jobs)
        self.config = Config(
            model_fetch_bytes_per_s=w.fetch_bytes_per_s if mode == "aware" else None,
            model_load_bytes_per_s=w.load_bytes_per_s,
        )
        self._last_prefetch = float("-inf")
        self.popularity: dict[str, float] = {}
        self._popular_at = 0.0
        self.future: dict[str, Job] = {}  # submitted later
        for a in _arrivals(w, names, rng):
            self.work[a.job.id] = a.work
            self.future[a.job.id] = a.job
            self._push(a.job.submitted_at, "arrive", a.job.id)

    def loop(self) -> ModelRunReport:
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, _, kind, key = heapq.heappop(self.events)
                self._handle(kind, key, now)
            if self.queued and any(n.job is None for n in self.nodes):
                self._cycle(now)  # with every GPU taken nothing can be placed: skip the cycle
            if self.mode == "aware" and now - self._last_prefetch >= self.w.prefetch_every_s:
                self._last_prefetch = now
                self._prefetch(now)
            if self.future or self.queued or self.allocs:
                self.report.end = now
        return self.report

    def _push(self, at: float, kind: str, key: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, key))

    def _handle(self, kind: str, key: str, now: float) -> None:
        """An event: ``arrive``, ``done``, ``fetched``; ``wake`` changes nothing itself (the
        loop's cycle after it is the point)."""
        if kind == "arrive":
            job = self.queued[key] = self.future.pop(key)
            self._popular(job.model or "", now)
        elif kind == "done":
            alloc = self.allocs.pop(key)
            self.ends.pop(key, None)
            self._node(alloc.node).job = None
        elif kind == "fetched":
            node_name, model = key.split("|")
            node = self._node(node_name)
            if node.fetching.pop(model, None) is not None:  # else a job took it over
                self._store(node, model)

    def _cycle(self, now: float) -> None:
        snapshot = self._snapshot()
        plan = schedule(snapshot, self.config, now)
        for p in plan.placements:
            self._start(self.queued.pop(p.job_ids[0]), self._node(p.node), p.gpu_indices, now)
        if len(plan.placements) < len(snapshot.queued):
            # a job waiting for its model's busy holder stops waiting at a time no event
            # marks (``scheduler.timers``): wake for it, as the server's loop does
            wake = Scheduler.from_snapshot(snapshot, self.config).wake_at(now)
            if wake is not None:
                self._push(wake, "wake", "")

    def _popular(self, model: str, now: float) -> None:
        """Recent demand per model: arrivals, decayed with a half-life of ``POPULARITY_HALF_S``."""
        decay = 0.5 ** ((now - self._popular_at) / POPULARITY_HALF_S)
        self._popular_at = now
        for m in self.popularity:
            self.popularity[m] *= decay
        self.popularity[model] = self.popularity.get(model, 0.0) + 1.0

    def _start(self, job: Job, node: _Node, gpus: tuple[int, ...], now: float) -> None:
        model = job.model or ""
        size = self.sizes[model]
        startup = 0.0
        if node.loaded != model:
            self.report.swaps += 1
            startup = size / self.w.load_bytes_per_s
            if model in node.fetching:  # a prefetch of it is under way: the job waits for it
                startup += max(0.0, node.fetching.pop(model) - now)
                self._store(node, model)
            elif model not in node.disk:
                self.report.downloads += 1
                startup += size / self.w.fetch_bytes_per_s
                self._store(node, model)
        node.disk.move_to_end(model)
        node.loaded, node.job = model, job.id
        work = self.work[job.id]
        self.report.waits.append(now + startup - job.submitted_at)
        self.report.startup_s += startup
        self.report.busy_s += work
        self.allocs[job.id] = Allocation(
            id=job.id, job_ids=(job.id,), node=node.name, user=job.user, gpu_indices=gpus,
            gpu_milli=1000, started_at=now, observed=AllocObserved.RUNNING,
        )  # fmt: skip
        self.ends[job.id] = now + startup + (job.estimated_runtime_s or work)
        self._push(now + startup + work, "done", job.id)

    def _store(self, node: _Node, model: str) -> None:
        """Put ``model`` on the node's disk, evicting least recently used models (not the
        one its GPU is using)."""
        node.disk[model] = self.sizes[model]
        while sum(node.disk.values()) > node.budget:
            victim = next((m for m in node.disk if m not in (model, node.loaded)), None)
            if victim is None:
                break
            del node.disk[victim]

    def _prefetch(self, now: float) -> None:
        snap = self._snapshot()
        caches = {
            n.name: CacheState(n.budget, sum(n.disk.values()), frozenset(n.fetching))
            for n in self.nodes
        }
        config = PrefetchConfig(max_total=4)
        for p in plan_prefetch(snap, caches, config, popularity=self.popularity):
            node = self._node(p.node)
            done = now + self.sizes[p.model] / self.w.fetch_bytes_per_s
            node.fetching[p.model] = done
            self.report.prefetches += 1
            self._push(done, "fetched", f"{p.node}|{p.model}")

    def _snapshot(self) -> Snapshot:
        aware = self.mode == "aware"
        seen = self.mode != "blind"
        nodes = tuple(
            Node(
                n.name,
                gpus=(Gpu(0, "RTX 4090", 24 * GIB),),
                cpus=8,
                models_on_disk=frozenset(n.disk) if seen else frozenset(),
                models_loaded=frozenset({n.loaded}) if seen and n.loaded else frozenset(),
            )
            for n in self.nodes
        )
        return Snapshot(
            nodes=nodes,
            queued=tuple(itertools.islice(self.queued.values(), self.w.window)),
            allocations=tuple(self.allocs.values()),
            expected_ends=dict(self.ends) if aware else {},
            model_sizes=self.sizes if aware else {},
        )

    def _node(self, name: str) -> _Node:
        return self.nodes[int(name.rsplit("-", 1)[1])]


def _arrivals(w: ModelWorkload, names: list[str], rng: random.Random) -> list[_Arrival]:
    """Poisson arrivals at ``load`` x the GPUs' compute rate; models by Zipf popularity."""
    weights = [1.0 / (k + 1) ** w.zipf_s for k in range(len(names))]
    rate = w.load * w.nodes / w.work_s
    out, t = [], 0.0
    for i in range(w.jobs):
        t += rng.expovariate(rate)
        model = rng.choices(names, weights)[0]
        work = max(1.0, rng.expovariate(1.0 / w.work_s))
        job = Job(
            id=f"job-{i:06d}",
            resources=ResourceRequest(gpus=1, cpus=1),
            user=f"user-{rng.randrange(w.users):03d}",
            model=model,
            submitted_at=t,
            estimated_runtime_s=work * rng.uniform(0.8, 1.2),  # users' estimates are rough
        )
        out.append(_Arrival(job, work))
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]
