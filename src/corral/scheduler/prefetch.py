"""The prefetch policy: copy popular models onto idle nodes ahead of demand.

``plan_prefetch(snapshot, caches, config) -> tuple[Prefetch, ...]`` is a pure
function, like ``schedule``: the server calls it after scheduling cycles and
sends the suggestions to agents, which download in the background (a job's
own download always goes first); the simulator calls the same function.

The decision, per model, most demanded first:

* **demand**: queued jobs (replicas) that name the model, plus its recent
  ``popularity`` (given by the caller: submissions over the last minutes);
* **copies**: schedulable nodes that have it (on disk or loaded) or are
  fetching it already;
* **wanted**: one copy per ``jobs_per_copy`` queued jobs, or the model's share
  of the popularity times the nodes that could run it, whichever is more; at
  most ``max_copies`` (and never more than there are nodes that could run it);
* while copies < wanted, pick an **idle** node (schedulable, no active
  allocation, not downloading anything, a cache budget reported) that could
  run the model's jobs (static filters: backend, selector, GPU model and
  count, CPUs) and has **room**: free budget, plus what the models on it
  that are less in demand take (its cache may evict them).
  Nodes with the most room come first; ties by name.

At most ``per_node`` suggestions per node and ``max_total`` per call, so a
burst of demand never turns into a flood of downloads. Models without a
known size (not in ``Snapshot.model_sizes``) are never prefetched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import ceil

from corral.core.errors import InvalidSpec
from corral.core.model import EMPTY, Job, Node
from corral.scheduler.api import Snapshot
from corral.scheduler.filters import DEFAULT_FILTERS, Filter
from corral.scheduler.need import need_of


@dataclass(frozen=True, slots=True)
class CacheState:
    """A node's model cache as its agent reported it."""

    budget_bytes: int
    used_bytes: int = 0
    fetching: frozenset[str] = frozenset()  # downloads in flight (any priority)


@dataclass(frozen=True, slots=True)
class PrefetchConfig:
    jobs_per_copy: int = 4  # queued jobs of a model that justify one more copy of it
    max_copies: int | None = None  # None: as many as the demand asks for
    per_node: int = 1  # new suggestions per node per call
    max_total: int = 8  # suggestions per call

    def __post_init__(self) -> None:
        for name in ("jobs_per_copy", "per_node", "max_total"):
            if getattr(self, name) < 1:
                raise InvalidSpec(f"prefetch.{name}", "must be >= 1")
        if self.max_copies is not None and self.max_copies < 1:
            raise InvalidSpec("prefetch.max_copies", "must be >= 1 or None")


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Suggest that ``node`` downloads ``model`` now."""

    node: str
    model: str
    reason: str


DEFAULT_PREFETCH = PrefetchConfig()


def plan_prefetch(
    snapshot: Snapshot,
    caches: Mapping[str, CacheState],
    config: PrefetchConfig = DEFAULT_PREFETCH,
    *,
    popularity: Mapping[str, float] = EMPTY,
    filters: Sequence[Filter] = DEFAULT_FILTERS,
) -> tuple[Prefetch, ...]:
    """Which idle nodes should fetch which popular models now (see the module docstring).

    ``popularity`` (optional): recent demand per model (say, submissions over the last
    minutes, decayed); it asks for copies in proportion to each model's share of it,
    so popular models are spread before a queue builds up.
    """
    sizes = snapshot.model_sizes
    queued, example = _demand(snapshot.queued, sizes)
    recent = {m: v for m, v in popularity.items() if v > 0 and sizes.get(m)}
    demand = {m: queued.get(m, 0) + recent.get(m, 0.0) for m in {*queued, *recent}}
    if not demand:
        return ()
    idle = _idle(snapshot, caches)
    free = {n.name: caches[n.name].budget_bytes - caches[n.name].used_bytes for n in idle}
    total = sum(recent.values())
    given: Counter[str] = Counter()
    out: list[Prefetch] = []
    for model in sorted(demand, key=lambda m: (-demand[m], m)):
        copies = _copies(snapshot.nodes, caches, model)
        job = example.get(model)
        capable = {n.name for n in snapshot.nodes if job is None or _could_run(n, job, filters)}
        share = recent.get(model, 0.0) / total if total else 0.0
        wanted = max(-(-queued.get(model, 0) // config.jobs_per_copy), ceil(share * len(capable)))
        wanted = min(wanted, len(capable), config.max_copies or len(capable))
        size = sizes[model]
        room = {n.name: free[n.name] + _colder(n, demand, sizes, model) for n in idle}
        candidates = sorted(
            (n for n in idle if n.name in capable and _lacks(n, caches, model)),
            key=lambda n: (-room[n.name], n.name),
        )
        for node in candidates:
            if copies >= wanted or len(out) >= config.max_total:
                break
            if given[node.name] >= config.per_node or room[node.name] < size:
                continue
            out.append(Prefetch(node.name, model, _why(model, queued.get(model, 0), copies)))
            given[node.name] += 1
            free[node.name] -= size
            copies += 1
    return tuple(out)


def _demand(queued: Sequence[Job], sizes: Mapping[str, int]) -> tuple[Counter[str], dict[str, Job]]:
    """Queued replicas per model with a known size, and one job per model (its needs)."""
    demand: Counter[str] = Counter()
    example: dict[str, Job] = {}
    for job in queued:
        if job.model and sizes.get(job.model):
            demand[job.model] += job.replicas
            example.setdefault(job.model, job)
    return demand, example


def _idle(snapshot: Snapshot, caches: Mapping[str, CacheState]) -> list[Node]:
    busy = {a.node for a in snapshot.allocations if a.active}
    return [
        n
        for n in snapshot.nodes
        if n.schedulable
        and n.name not in busy
        and n.name in caches
        and caches[n.name].budget_bytes > 0
        and not caches[n.name].fetching
    ]


def _colder(node: Node, demand: Mapping[str, float], sizes: Mapping[str, int], model: str) -> int:
    """Bytes of models on the node less in demand than ``model``: room its cache can make."""
    want = demand[model]
    return sum(sizes.get(m, 0) for m in node.models_on_disk if demand.get(m, 0) < want)


def _copies(nodes: Sequence[Node], caches: Mapping[str, CacheState], model: str) -> int:
    return sum(1 for n in nodes if n.schedulable and not _lacks(n, caches, model))


def _lacks(node: Node, caches: Mapping[str, CacheState], model: str) -> bool:
    cache = caches.get(node.name)
    fetching = cache is not None and model in cache.fetching
    return not (fetching or model in node.models_on_disk or model in node.models_loaded)


def _could_run(node: Node, job: Job, filters: Sequence[Filter]) -> bool:
    need = need_of(job)
    return all(f.check(need, node) is None for f in filters)


def _why(model: str, queued: int, copies: int) -> str:
    had = f"{copies} node{'s' if copies != 1 else ''} had it"
    if not queued:
        return f"{model} is in demand lately; {had}"
    return f"{queued} queued job{'s' if queued != 1 else ''} need {model}; {had}"
