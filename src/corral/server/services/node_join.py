"""A node joins: its row, written at hello, bound to its agent's key and to the join token
that admitted the agent.

A join token holds at most ``agents.max_nodes_per_token`` node names. Fleets churn
(machines come and go, often under new names), so a token at its cap makes room for a
new name by forgetting its node that has been lost longest; only when every one of its
nodes is live is the new name refused (RESOURCE_EXHAUSTED: the agent dials again later).
A leaked token thus cannot grow the node table without bound, and a fleet that replaces
its machines needs no admin to clean up after it.
"""

from __future__ import annotations

from corral.core.errors import LimitReached, LinkError
from corral.core.events import EventKind
from corral.core.model import Node
from corral.core.states import NODE, UNSTARTED, AllocDesired, NodeState, StopReason, transition
from corral.server.agentlink.base import Assignment, Inventory, StopOrder
from corral.server.services.node_keys import key_hash, may_hold, taken
from corral.server.services.outcomes import Ending
from corral.server.services.placement import assignment
from corral.server.services.rendezvous import master_of
from corral.server.services.settling import end_allocation
from corral.server.services.unit import Runtime, Tx
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import inventory_to_json

LOOK_PAST = 8
"""Lost nodes looked at beyond those needed, in case some still have work to settle."""


async def upsert_node(tx: Tx, inv: Inventory, cap: int, retry_s: float) -> Node:
    """Register ``inv``'s node or refresh it (a lost one is ready again); ``cap`` is the
    token's limit on node names, ``retry_s`` when a refused agent may try again."""
    probe = Node(
        inv.node,
        inv.gpus,
        inv.cpus,
        inv.labels,
        inv.models_on_disk,
        inv.models_loaded,
        inv.backends,
        numa_cpus=inv.numa_cpus,
        memory_bytes=inv.memory_bytes,
    )
    values: dict[str, object] = {"inventory": inventory_to_json(probe), "last_seen": tx.now}
    rec = await node_repo.get(tx.conn, inv.node)
    if rec is not None and not may_hold(rec, inv.key):  # claimed since ``claim``
        raise LinkError(taken(inv.node))
    if inv.key:  # bound to this agent (first join, or the one before it was lost)
        values["key_hash"] = key_hash(inv.key)
    if inv.token and (rec is None or rec.token_id != inv.token):
        await make_room(tx, inv.token, cap, retry_s)
        values["token_id"] = inv.token
    if rec is None:
        await node_repo.insert(
            tx.conn,
            name=inv.node,
            state=NodeState.READY.value,
            paused=False,
            draining=False,
            joined_at=tx.now,
            **values,
        )
        tx.emit(
            EventKind.NODE_JOINED,
            team=None,
            node=inv.node,
            gpus=len(inv.gpus),
            agent_version=inv.agent_version,
        )
        return probe
    state = rec.node.state
    if state is NodeState.LOST:
        state = transition(NODE, inv.node, state, NodeState.READY, at=tx.now, why="hello")
    if not await node_repo.update(tx.conn, rec, state=state.value, **values):
        raise LinkError(f"node {inv.node} changed during hello; reconnect")
    tx.emit(EventKind.NODE_JOINED, team=None, node=inv.node, gpus=len(inv.gpus), rejoined=True)
    return rec.node


async def make_room(tx: Tx, token_id: str, cap: int, retry_s: float) -> None:
    """Make room under ``token_id`` for one more node name: forget its longest-lost nodes
    (those with no work left) down to ``cap - 1``, or raise ``LimitReached``."""
    held = await node_repo.held_by_token(tx.conn, token_id)
    excess = held - (cap - 1)
    if excess <= 0:
        return
    for name in await node_repo.lost_of_token(tx.conn, token_id, excess + LOOK_PAST):
        if excess > 0 and await _forget(tx, name, token_id):
            excess -= 1
    if excess > 0:
        raise LimitReached(
            f"join token {token_id} already holds {held} node names and none is free to go "
            f"(the limit is {cap}: agents.max_nodes_per_token). Delete nodes that are gone "
            "(corral node delete NAME), join under an existing name, or raise the limit",
            retry_s,
        )


async def _forget(tx: Tx, name: str, token_id: str) -> bool:
    """Forget a lost node with no work left on it (its allocations were requeued)."""
    if await alloc_repo.active(tx.conn, node=name) or not await node_repo.delete(tx.conn, name):
        return False
    why = f"join token {token_id} reached agents.max_nodes_per_token: the longest-lost name goes"
    tx.emit(EventKind.NODE_REMOVED, team=None, node=name, data={"reason": why})
    return True


async def reconcile(
    rt: Runtime, tx: Tx, node: str, reported: dict[str, int]
) -> tuple[list[Assignment], list[StopOrder]]:
    """What a node saying hello must be sent, given the allocations (id -> attempt) its agent
    ``reported`` holding: stops for held work the server no longer wants, assignments for
    work it should hold but does not (a replica waiting for its gang's go counts as not
    started); work it lost while running ends as lost, and work it holds that the server
    does not know is stopped."""
    assign, stop = [], []
    server_side = await alloc_repo.active(tx.conn, node=node)
    for rec in server_side:
        a = rec.alloc
        if reported.get(a.id) == a.attempt:
            if a.desired is not AllocDesired.RUN:
                reason = StopReason(rec.stop_reason or "cancel")
                stop.append(StopOrder(a.id, reason, rec.stop_grace_s or 0.0))
        elif a.observed in UNSTARTED and a.desired is AllocDesired.RUN:
            works = list((await job_repo.get_many(tx.conn, a.job_ids)).values())
            master = await master_of(tx.conn, a, works)
            assign.append(assignment(a, works, master=master))
        elif a.observed in UNSTARTED:
            await end_allocation(rt, tx, rec, Ending.STOPPED)
        else:
            await end_allocation(rt, tx, rec, Ending.LOST, error="the agent restarted and lost it")
    known = {r.alloc.id for r in server_side}
    stop.extend(StopOrder(i, StopReason.CANCEL) for i in reported if i not in known)
    return assign, stop
