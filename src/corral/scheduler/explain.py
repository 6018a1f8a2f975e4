"""Why a job stays queued, as data: reason codes with node counts and a remedy.

"4 nodes: not enough free VRAM; 1 node: paused; 2 nodes: missing model
sdxl-base (downloadable)". Every node is counted once, under the first
filter that ruled it out (cheapest first, as in the filter chain); nodes
that could run the job but are busy are counted under the dynamic reason
(free cards, free VRAM, free CPUs, free memory). The remedy says what could help:
``none`` when no node could ever run the job as it is, else ``wait``.
Preemption upgrades it to ``preempt`` (see ``preemption.py``).
"""

from __future__ import annotations

import math
from collections import Counter

from corral.core.model import Job
from corral.core.resources import cpus_text, memory_text
from corral.scheduler.api import Reason, ReasonCode, Remedy
from corral.scheduler.cycle import Cycle
from corral.scheduler.need import Need
from corral.scheduler.node_cap import NodeCap
from corral.scheduler.preemption import Room

STATIC_MESSAGES: dict[ReasonCode, str] = {
    ReasonCode.NODE_NOT_READY: "not ready (lost)",
    ReasonCode.NODE_PAUSED: "paused",
    ReasonCode.NODE_DRAINING: "draining",
    ReasonCode.SELECTOR_MISMATCH: "labels do not match the node selector",
    ReasonCode.BACKEND_MISSING: "backend not offered",
    ReasonCode.GPU_MODEL_MISMATCH: "no GPU of an accepted model",
    ReasonCode.TOO_FEW_GPUS: "too few GPUs",
    ReasonCode.INSUFFICIENT_VRAM: "insufficient VRAM",
    ReasonCode.INSUFFICIENT_GPUS: "not enough free GPUs",
    ReasonCode.INSUFFICIENT_CPUS: "not enough CPUs",
    ReasonCode.INSUFFICIENT_MEMORY: "not enough memory",
    ReasonCode.RESERVED: "reserved for a bigger job ahead in the queue",
}


def explain(cycle: Cycle, need: Need, model: str | None) -> tuple[tuple[Reason, ...], Remedy]:
    """Reasons (most nodes first) and a remedy for a need that fits nowhere now."""
    counts: Counter[ReasonCode] = Counter()
    feasible = 0
    missing_model = 0
    for cls, members in enumerate(cycle.class_members):
        code = cycle.checks.reason(need, cls)
        if code is not None:
            counts[code] += len(members)
            continue
        feasible += len(members)
        rep = cycle.representatives[cls]
        if model and model not in rep.models_on_disk and model not in rep.models_loaded:
            missing_model += len(members)
        for idx in members:
            counts[dynamic_reason(cycle.cap.nodes[idx], need)] += 1
    reasons = [
        Reason(code, n, _message(code, need)) for code, n in sorted(counts.items(), key=_order)
    ]
    if missing_model:
        text = f"missing model {model} (downloadable)"
        reasons.append(Reason(ReasonCode.MODEL_MISSING, missing_model, text))
    if not cycle.class_members:
        reasons.append(Reason(ReasonCode.TOO_FEW_GPUS, 0, "no nodes in the cluster"))
    return tuple(reasons), Remedy.WAIT if feasible else Remedy.NONE


def dynamic_reason(nc: NodeCap, need: Need) -> ReasonCode:
    """Why ``need`` does not fit the free capacity of a statically suitable node."""
    if nc.hidden:
        return ReasonCode.RESERVED
    if need.cpu_only:
        return _cpus(nc, need)
    if need.gpus:
        if nc.whole_free < need.gpus:
            return ReasonCode.INSUFFICIENT_GPUS
        if len(nc.whole_free_cards(need.vram, need.gpu_models)) < need.gpus:
            return ReasonCode.INSUFFICIENT_VRAM
        return _cpus(nc, need)
    if nc.best_shared_gpu(need.vram, need.milli, need.gpu_models) is not None:
        return _cpus(nc, need)
    if need.vram and not need.milli:
        return ReasonCode.INSUFFICIENT_VRAM  # VRAM is all it asks for
    roomy = any(card.free >= need.milli for card in nc.cards)
    return ReasonCode.INSUFFICIENT_VRAM if roomy and need.vram else ReasonCode.INSUFFICIENT_GPUS


def _cpus(nc: NodeCap, need: Need) -> ReasonCode:
    """Too few CPUs: on the node, or (the node has enough) on its free GPUs' NUMA nodes;
    or too little free memory, when the node has the CPUs."""
    if nc.cpus_free >= need.cpus:
        if nc.mem_free < need.memory:
            return ReasonCode.INSUFFICIENT_MEMORY
        if nc.numa_free:
            return ReasonCode.INSUFFICIENT_NUMA_CPUS
    return ReasonCode.INSUFFICIENT_CPUS


def _order(item: tuple[ReasonCode, int]) -> tuple[int, str]:
    return (-item[1], item[0].value)


def _message(code: ReasonCode, need: Need) -> str:
    if code is ReasonCode.SELECTOR_MISMATCH:
        wanted = ", ".join(f"{k}={v}" for k, v in need.selector)
        return f"labels do not match {wanted}"
    if code is ReasonCode.BACKEND_MISSING:
        return f"no backend {need.backend}"
    if code is ReasonCode.GPU_MODEL_MISMATCH:
        return f"no GPU of model {'/'.join(sorted(need.gpu_models))}"
    if code is ReasonCode.TOO_FEW_GPUS:
        return f"fewer than {max(need.gpus, 1)} usable GPU{'s' if need.gpus > 1 else ''}"
    if code is ReasonCode.INSUFFICIENT_GPUS:
        return f"not enough free GPU capacity for {need.describe()}"
    if code is ReasonCode.INSUFFICIENT_VRAM:
        return f"insufficient VRAM for {need.describe()}"
    if code in _HOST:
        return _host_message(code, need)
    return STATIC_MESSAGES.get(code, code.value)


_HOST = frozenset(
    {
        ReasonCode.INSUFFICIENT_CPUS,
        ReasonCode.INSUFFICIENT_NUMA_CPUS,
        ReasonCode.INSUFFICIENT_MEMORY,
    }
)


def _host_message(code: ReasonCode, need: Need) -> str:
    if code is ReasonCode.INSUFFICIENT_MEMORY:
        return f"not enough free memory for {memory_text(need.memory)}"
    where = " on its GPUs' NUMA node" if code is ReasonCode.INSUFFICIENT_NUMA_CPUS else ""
    return f"not enough free CPUs{where} for {cpus_text(need.cpus)}"


def simple(code: ReasonCode, message: str, remedy: Remedy) -> tuple[tuple[Reason, ...], Remedy]:
    """A reason that is not about nodes (not before, quota, cycle limit)."""
    return (Reason(code, 0, message),), remedy


def when_evictable(job: Job, rooms: list[Room], now: float, least: float) -> Reason:
    """``"team a's work passes its 60 s minimum run time in ~38 s"``: of the victims a
    patient what-if chose (``rooms``), the one that may be evicted last; an empty message
    when all may go now. ``least``: the minimum run time."""
    last, wait = None, 0.0
    for room in rooms:
        for victim in room.victims:
            left = victim.started_at + least - now
            if left > wait:
                last, wait = victim, left
    if last is None:
        return Reason(ReasonCode.MIN_RUNTIME, 0, "")
    whose = (
        f"{last.allocs[0].priority} work" if last.team == job.team else f"team {last.team}'s work"
    )
    text = f"{whose} passes its {least:g} s minimum run time in ~{math.ceil(wait)} s"
    return Reason(ReasonCode.MIN_RUNTIME, 0, text)
