"""Builders for scheduler tests: ``node("n1").gpus(8, "H100").label(rack="r1").build()``.

Each builder holds the fields of one core value and returns itself from every
setter, so a scenario reads as a sentence. ``build()`` makes the frozen value.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from corral.core import (
    GIB,
    Allocation,
    AllocObserved,
    Gpu,
    Job,
    JobKind,
    Node,
    NodeState,
    ResourceRequest,
    Team,
)
from corral.scheduler import Snapshot


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._node = Node(name=name, cpus=64)

    def gpus(self, count: int, model: str = "A100", vram_gib: float = 80) -> NodeBuilder:
        cards = tuple(Gpu(i, model, int(vram_gib * GIB)) for i in range(count))
        self._node = replace(
            self._node, gpus=self._node.gpus + _reindex(cards, len(self._node.gpus))
        )
        return self

    def cpus(self, count: int) -> NodeBuilder:
        self._node = replace(self._node, cpus=count)
        return self

    def memory(self, gib: float) -> NodeBuilder:
        """Host memory it offers, GiB."""
        self._node = replace(self._node, memory_bytes=int(gib * GIB))
        return self

    def numa(self, gpu_numa: tuple[int, ...], cpus: tuple[float, ...]) -> NodeBuilder:
        """Each GPU's NUMA node and each NUMA node's CPU slots (node ``i`` has ``cpus[i]``)."""
        cards = tuple(replace(g, numa=n) for g, n in zip(self._node.gpus, gpu_numa, strict=True))
        self._node = replace(
            self._node, gpus=cards, cpus=sum(cpus), numa_cpus=tuple(enumerate(cpus))
        )
        return self

    def label(self, **labels: str) -> NodeBuilder:
        self._node = replace(self._node, labels={**self._node.labels, **labels})
        return self

    def models(self, *, loaded: tuple[str, ...] = (), on_disk: tuple[str, ...] = ()) -> NodeBuilder:
        self._node = replace(
            self._node,
            models_loaded=frozenset(loaded),
            models_on_disk=frozenset(on_disk) | frozenset(loaded),
        )
        return self

    def backends(self, *names: str) -> NodeBuilder:
        self._node = replace(self._node, backends=frozenset(names))
        return self

    def paused(self) -> NodeBuilder:
        self._node = replace(self._node, paused=True)
        return self

    def draining(self) -> NodeBuilder:
        self._node = replace(self._node, draining=True)
        return self

    def lost(self) -> NodeBuilder:
        self._node = replace(self._node, state=NodeState.LOST)
        return self

    def build(self) -> Node:
        return self._node


def _reindex(cards: tuple[Gpu, ...], start: int) -> tuple[Gpu, ...]:
    return tuple(replace(g, index=start + i) for i, g in enumerate(cards))


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self._fields: dict[str, Any] = {"id": job_id}
        self._res: dict[str, Any] = {}

    def gpus(self, count: float) -> JobBuilder:
        if count >= 1:
            self._res["gpus"] = int(count)
        else:
            self._res["gpu_milli"] = round(count * 1000)
        return self

    def vram(self, gib: float) -> JobBuilder:
        self._res["vram_bytes"] = int(gib * GIB)
        return self

    def cpus(self, count: int) -> JobBuilder:
        self._res["cpus"] = count
        return self

    def memory(self, gib: float) -> JobBuilder:
        """Host memory per replica, GiB."""
        self._res["memory_bytes"] = int(gib * GIB)
        return self

    def gpu_models(self, *models: str) -> JobBuilder:
        self._res["gpu_models"] = frozenset(models)
        return self

    def cpu_fallback(self) -> JobBuilder:
        self._res["cpu_fallback"] = True
        return self

    def select(self, **labels: str) -> JobBuilder:
        self._fields["node_selector"] = labels
        return self

    def sample(self, batch_key: str | None = None) -> JobBuilder:
        self._fields["kind"] = JobKind.SAMPLE
        self._fields["batch_key"] = batch_key
        return self

    def set(self, **fields: Any) -> JobBuilder:
        self._fields.update(fields)
        return self

    def build(self) -> Job:
        return Job(resources=ResourceRequest(**self._res), **self._fields)


class AllocBuilder:
    def __init__(self, alloc_id: str, node: str) -> None:
        self._fields: dict[str, Any] = {
            "id": alloc_id,
            "job_ids": (alloc_id,),
            "node": node,
            "observed": AllocObserved.RUNNING,
        }

    def cards(self, *indices: int, milli: int = 1000, vram_gib: float = 0) -> AllocBuilder:
        self._fields.update(gpu_indices=indices, gpu_milli=milli, vram_bytes=int(vram_gib * GIB))
        return self

    def set(self, **fields: Any) -> AllocBuilder:
        self._fields.update(fields)
        return self

    def build(self) -> Allocation:
        return Allocation(**self._fields)


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


def alloc(alloc_id: str, node_name: str) -> AllocBuilder:
    return AllocBuilder(alloc_id, node_name)


def team(name: str, quota: float, borrow: float | None = None, weight: float = 1.0) -> Team:
    return Team(name, quota_gpus=quota, borrow_limit_gpus=borrow, weight=weight)


def snapshot(
    nodes: list[NodeBuilder] | None = None,
    jobs: list[JobBuilder] | None = None,
    allocs: list[AllocBuilder] | None = None,
    teams: list[Team] | None = None,
) -> Snapshot:
    return Snapshot(
        nodes=tuple(n.build() for n in nodes or ()),
        queued=tuple(j.build() for j in jobs or ()),
        allocations=tuple(a.build() for a in allocs or ()),
        teams=tuple(teams or ()),
    )
