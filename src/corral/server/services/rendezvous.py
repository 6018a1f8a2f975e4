"""A gang's rendezvous, as its assignments carry it (``core/rendezvous.py``).

Computed from stored rows, never stored itself: the first assignment and
every resend (a reconnecting agent, ``Delivery``) name the same master,
because it depends only on replica 0's allocation and its node's labels.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Allocation
from corral.core.rendezvous import ADDRESS_LABEL, master_port
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import JobRecord

NO_MASTER = ("", 0)


async def master_of(
    conn: AsyncConnection, alloc: Allocation, jobs: Sequence[JobRecord]
) -> tuple[str, int]:
    """(address, port) of ``alloc``'s gang; ``NO_MASTER`` for work that is not a gang."""
    if not jobs or jobs[0].job.replicas <= 1:
        return NO_MASTER
    first = alloc
    if alloc.replica != 0:
        for other_id in jobs[0].allocation_ids:
            rec = await alloc_repo.get(conn, other_id)
            if rec is not None and rec.alloc.replica == 0:
                first = rec.alloc
                break
        else:
            return NO_MASTER  # replica 0 is gone: this attempt is ending anyway
    return await master_at(conn, first)


async def master_at(conn: AsyncConnection, replica0: Allocation) -> tuple[str, int]:
    """The master of the gang whose replica 0 is ``replica0``: its node's reported address
    (the node's name when its agent reported none: a name the cluster's DNS resolves)."""
    node = await node_repo.get(conn, replica0.node)
    labels = node.node.labels if node is not None else {}
    return labels.get(ADDRESS_LABEL) or replica0.node, master_port(replica0.id)
