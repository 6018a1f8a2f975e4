"""A node leaving: marked lost, its allocations ended as lost, their jobs requeued.

Two things make a node leave: silence (the liveness loop, after
``scheduling.node_timeout_s`` without a heartbeat) and the revocation of the
token its agent joined with (``services.sessions``: its work must not keep
running for an agent the admin shut out). Both take the same path, so a job
on a departed node is requeued (attempt + 1, resuming from its last
checkpoint) or fails when out of attempts, whichever way the node left.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.core.events import EventKind
from corral.core.states import NODE, NodeState, transition
from corral.server.services.outcomes import Ending
from corral.server.services.settling import end_allocation
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import NodeRecord

Still = Callable[[NodeRecord, float], bool]
"""Re-checked inside the transaction (the node, now): does the reason to leave still hold?"""


async def lose_node(rt: Runtime, name: str, why: str, still: Still | None = None) -> bool:
    """Mark ``name`` lost (``why`` goes into its history and its allocations' error) and
    end its allocations as lost. False when it is not ready, or ``still`` says it came back."""
    async with rt.tx(reschedule=True) as tx:
        rec = await node_repo.get(tx.conn, name)
        if rec is None or rec.node.state is not NodeState.READY:
            return False
        if still is not None and not still(rec, tx.now):
            return False
        state = transition(NODE, name, rec.node.state, NodeState.LOST, at=tx.now, why=why)
        if not await node_repo.update(tx.conn, rec, state=state.value):
            return False
        tx.emit(EventKind.NODE_LOST, team=None, node=name, last_seen=rec.node.last_seen)
        error = f"node {name} was lost" if why == "timeout" else f"node {name} left: {why}"
        for alloc in await alloc_repo.active(tx.conn, node=name):
            await end_allocation(rt, tx, alloc, Ending.LOST, error=error)
    return True
