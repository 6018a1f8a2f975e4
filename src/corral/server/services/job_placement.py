"""Where a job runs: each of its current allocations with the GPUs it holds and how they
are linked, for the job's page (``GET /v1/jobs/{id}``'s ``placement``).

The topology is described from the node's reported GPUs (``core/topology.py``),
not stored: "GPUs 0,1 (nvlink) on NUMA node 0". A node whose agent reported no
topology, and work on no GPU, get an empty description.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.model import Allocation, Node
from corral.core.topology import describe, of_gpus
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import JobRecord


@dataclass(frozen=True, slots=True)
class Placed:
    allocation: str
    node: str
    replica: int
    gpu_indices: tuple[int, ...]
    cpus: float
    observed: str
    topology: str
    memory_bytes: int


async def placement(rt: Runtime, rec: JobRecord) -> list[Placed]:
    """``rec``'s current allocations (a gang's replicas in rank order)."""
    if not rec.allocation_ids:
        return []
    async with rt.db.read() as conn:
        allocs = [r.alloc for r in await alloc_repo.get_many(conn, list(rec.allocation_ids))]
        nodes = {name: await node_repo.get(conn, name) for name in {a.node for a in allocs}}
    return [
        _placed(a, found.node if (found := nodes.get(a.node)) else None)
        for a in sorted(allocs, key=lambda a: a.replica)
    ]


def _placed(alloc: Allocation, node: Node | None) -> Placed:
    lookups = of_gpus(node.gpus) if node is not None else None
    topology = describe(alloc.gpu_indices, *lookups) if lookups and alloc.gpu_indices else ""
    return Placed(
        alloc.id,
        alloc.node,
        alloc.replica,
        alloc.gpu_indices,
        alloc.cpus,
        alloc.observed.value,
        topology,
        alloc.memory_bytes,
    )
