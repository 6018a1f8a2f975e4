"""What the last kept cycle took or gave back on the kept capacity index, until its caller
says what it applied.

A kept ``Scheduler`` keeps its cycle's reserves and releases: the caller usually
applies the plan, and its ``start`` and ``end`` calls then find the capacity taken
or given back already, so nothing is computed twice.

1. A start of an allocation a placement of the last plan made, holding exactly
   what it reserved, moves nothing: the cycle took that room.
2. A start of one the plan made differently gives the planned room back first,
   then takes its own, as any other start does.
3. An end of an allocation the last plan preempted moves nothing: the cycle gave
   that room back.
4. When the next cycle starts, whatever the caller did not apply is undone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from corral.core.model import Allocation
from corral.core.resources import cpu_milli
from corral.scheduler.api import Placement, Plan
from corral.scheduler.capacity import Capacity
from corral.scheduler.cluster import Cluster
from corral.scheduler.node_cap import NodeCap
from corral.scheduler.planned import Planned
from corral.scheduler.slots import Slot

if TYPE_CHECKING:
    from mypy_extensions import i64


class Carried:
    """The last plan's placements not yet started and preemptions not yet ended."""

    __slots__ = ("pending", "released")

    def __init__(self) -> None:
        self.pending = Planned()
        self.released: dict[str, Allocation] = {}

    def keep(self, plan: Plan, held: Mapping[str, Slot]) -> None:
        """A kept cycle's ``plan``, whose reserves and releases stay on the kept cluster."""
        self.pending = Planned(plan.placements)
        released = self.released
        for stop in plan.preemptions:
            slot = held.get(stop.allocation_id)
            if slot is not None and slot.alloc.active:
                released[stop.allocation_id] = slot.alloc

    def undo(self, cluster: Cluster | None) -> None:
        """Rule 4: give back what the plan took and take back what it gave, where the
        caller did not apply it; then hold nothing."""
        pending, released = self.pending, self.released
        self.pending, self.released = Planned(), {}
        if cluster is None:
            return
        for p in pending.left():
            adjust(
                cluster,
                p.node,
                p.gpu_indices,
                p.on_cpu,
                p.gpu_milli,
                p.vram_bytes,
                cpu_milli(p.cpus),
                p.memory_bytes,
            )
        for a in released.values():
            adjust(
                cluster,
                a.node,
                a.gpu_indices,
                a.on_cpu,
                -a.gpu_milli,
                -a.vram_bytes,
                -cpu_milli(a.cpus),
                -a.memory_bytes,
            )

    def started(self, cluster: Cluster, alloc: Allocation) -> bool:
        """Rules 1 and 2 for a start of ``alloc``: True when its room is taken already."""
        planned = self.pending.take(alloc.id)
        if planned is None:
            return False
        if _same(planned, alloc):
            return True
        p = planned
        cpus = cpu_milli(p.cpus)
        adjust(
            cluster,
            p.node,
            p.gpu_indices,
            p.on_cpu,
            p.gpu_milli,
            p.vram_bytes,
            cpus,
            p.memory_bytes,
        )
        return False

    def ended(self, alloc_id: str) -> bool:
        """Rule 3 for an end of ``alloc_id``: True when its room is given back already."""
        if alloc_id in self.released:
            del self.released[alloc_id]
            return True
        return False


def adjust(
    cluster: Cluster,
    node: str,
    indices: tuple[int, ...],
    on_cpu: bool,
    milli: int,
    vram: int,
    cpus: int,
    memory: int,
) -> None:
    """Between cycles: give back (positive) or take (negative) capacity on the kept cluster."""
    nc = cluster.cap.by_name.get(node)
    if nc is not None:
        adjust_on(cluster.cap, nc, indices, on_cpu, milli, vram, cpus, memory)


def adjust_on(
    cap: Capacity,
    nc: NodeCap,
    indices: tuple[int, ...],
    on_cpu: bool,
    milli: i64,
    vram: i64,
    cpus: i64,
    memory: i64,
) -> None:
    """``adjust`` on a node already found (the scheduler has its index)."""
    cap.adjust(nc, () if on_cpu else nc.to_positions(indices), milli, vram, cpus, memory)


def _same(p: Placement, alloc: Allocation) -> bool:
    """Does ``alloc`` hold exactly what placement ``p`` reserved?"""
    return (
        p.node == alloc.node
        and p.gpu_indices == alloc.gpu_indices
        and p.gpu_milli == alloc.gpu_milli
        and p.vram_bytes == alloc.vram_bytes
        and p.cpus == alloc.cpus
        and p.memory_bytes == alloc.memory_bytes
        and p.on_cpu == alloc.on_cpu
    )
