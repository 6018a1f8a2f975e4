"""Static filters: can this node ever run this need? (STYLE.md habit 5).

A filter is a tiny protocol: a ``name`` and ``check(need, node)`` returning
``None`` (pass) or the ``ReasonCode`` that rules the node out. The chain runs
cheapest first (a flag, a dict lookup, a set, then arithmetic) and stops at
the first failure, like Nomad's feasibility stack.

These verdicts depend only on what a node *is*, never on what it has free,
so nodes are grouped into equivalence classes (same state, relevant labels,
cards, backends, CPU count) and the chain runs once per (need, class).
Dynamic checks (free cards, free VRAM, free CPUs) live in ``fit.py``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from corral.core.model import Node
from corral.core.resources import cpu_milli
from corral.core.states import NodeState
from corral.scheduler.api import ReasonCode
from corral.scheduler.need import Need


class Filter(Protocol):
    """Rules nodes out for a need. Must depend only on static node facts."""

    name: str

    def check(self, need: Need, node: Node) -> ReasonCode | None: ...


class Ready:
    name = "ready"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        return None if node.state is NodeState.READY else ReasonCode.NODE_NOT_READY


class NotPaused:
    name = "not_paused"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        return ReasonCode.NODE_PAUSED if node.paused else None


class NotDraining:
    name = "not_draining"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        return ReasonCode.NODE_DRAINING if node.draining else None


class Selector:
    name = "selector"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        labels = node.labels
        for key, value in need.selector:
            if labels.get(key) != value:
                return ReasonCode.SELECTOR_MISMATCH
        return None


class Backend:
    name = "backend"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        if need.backend is None or need.backend in node.backends:
            return None
        return ReasonCode.BACKEND_MISSING


class GpuModel:
    """The job names acceptable card models; the node must have enough of them."""

    name = "gpu_model"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        if need.cpu_only or not need.gpu_models:
            return None
        if any(g.model in need.gpu_models for g in node.gpus):
            return None
        return ReasonCode.GPU_MODEL_MISMATCH


class GpuCount:
    """Enough cards (of an accepted model, with enough VRAM) exist on the node at all."""

    name = "gpu_count"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        if need.cpu_only:
            return None
        usable = [g for g in node.gpus if not need.gpu_models or g.model in need.gpu_models]
        wanted = max(need.gpus, 1)
        if len(usable) < wanted:
            return ReasonCode.TOO_FEW_GPUS
        big_enough = sum(1 for g in usable if g.vram_bytes >= need.vram)
        return None if big_enough >= wanted else ReasonCode.INSUFFICIENT_VRAM


class CpuCount:
    name = "cpu_count"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        return ReasonCode.INSUFFICIENT_CPUS if cpu_milli(node.cpus) < need.cpus else None


class MemorySize:
    """The node has the memory at all (a node that reports none has none to give)."""

    name = "memory_size"

    def check(self, need: Need, node: Node) -> ReasonCode | None:
        return ReasonCode.INSUFFICIENT_MEMORY if node.memory_bytes < need.memory else None


DEFAULT_FILTERS: tuple[Filter, ...] = (
    Ready(),
    NotPaused(),
    NotDraining(),
    Selector(),
    Backend(),
    GpuModel(),
    GpuCount(),
    CpuCount(),
    MemorySize(),
)
"""Cheapest first; the first failure is the reason reported for a node."""


def class_key(node: Node, label_keys: frozenset[str]) -> Hashable:
    """What static filters can see of ``node``: equal keys, equal verdicts.

    Only labels some queued job selects on are part of the key, so per-node
    labels (hostnames) do not split classes. Models are not part of it:
    locality is a preference, indexed separately (``Capacity.by_model``).
    """
    labels = (
        tuple(sorted((k, v) for k, v in node.labels.items() if k in label_keys))
        if label_keys
        else ()
    )
    cards = tuple((g.model, g.vram_bytes) for g in node.gpus)
    backends = node.backends
    return (
        node.state,
        node.paused,
        node.draining,
        labels,
        cards,
        backends,
        node.cpus,
        node.memory_bytes,
    )


class StaticChecks:
    """Memoised verdicts of a filter chain per (need, node class)."""

    def __init__(self, representatives: Sequence[Node], filters: Sequence[Filter]) -> None:
        self._reps = representatives
        self._filters = filters
        self._verdicts: dict[tuple[Need, int], ReasonCode | None] = {}

    def reason(self, need: Need, cls: int) -> ReasonCode | None:
        """Why class ``cls`` can never run ``need``, or ``None`` when it can."""
        key = (need, cls)
        try:
            return self._verdicts[key]
        except KeyError:
            pass
        node = self._reps[cls]
        verdict = None
        for f in self._filters:
            verdict = f.check(need, node)
            if verdict is not None:
                break
        self._verdicts[key] = verdict
        return verdict
