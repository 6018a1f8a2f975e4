"""A gang starts only when every replica's node has confirmed it can start.

A replica's first minutes can go to downloading a model, fetching the gang's
checkpoint or its input files; a rank launched meanwhile on another node would
sit in its rendezvous (``init_process_group``) burning its timeout. So an agent
prepares a gang replica, says ``Ready`` and waits; when every replica of the
gang is ready the server says ``Go`` to each, and they launch together.

* The go is sent from the unit that records the last ``Ready`` (after commit),
  and again by ``Delivery.resync`` while a ready replica waits, so a lost
  message or a replica held by another server replica delays the start and
  never strands it. The agent ignores a go it has no waiting replica for.
* A replica that never gets ready is a straggler (``stragglers.py``): its
  attempt fails and the ready replicas are stopped with the rest of the gang.
* An agent that does not know the two phases starts at once (``started`` from
  ``pending``); its gang mates' go is then sent as soon as they are ready.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Allocation
from corral.core.states import ALLOCATION, AllocDesired, AllocObserved, transition
from corral.server.agentlink.base import Ack
from corral.server.services.unit import Runtime, Tx
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store.records import AllocRecord


async def mark_ready(rt: Runtime, tx: Tx, rec: AllocRecord) -> Ack:
    """Record that ``rec``'s replica is prepared; say go to the gang if it was the last."""
    alloc = rec.alloc
    if alloc.observed is AllocObserved.PENDING:
        observed = transition(
            ALLOCATION, alloc.id, alloc.observed, AllocObserved.READY, at=tx.now, why="ready"
        )
        await alloc_repo.update(tx.conn, rec, observed=observed.value)
        ack = Ack.ACCEPTED
    elif alloc.observed is AllocObserved.READY:
        ack = Ack.DUPLICATE  # resent after a reconnect: it may have missed its go
    else:
        return Ack.DUPLICATE
    waiting = await waiting_for_go(tx.conn, alloc, ready_now=alloc.id)
    for mate in waiting:

        async def go(mate: Allocation = mate) -> None:
            await rt.link.go(mate.node, mate.id, mate.attempt)

        tx.then(go)
    return ack


async def waiting_for_go(
    conn: AsyncConnection, alloc: Allocation, ready_now: str = ""
) -> list[Allocation]:
    """The replicas of ``alloc``'s gang to say go to: every ready one, once no replica is
    still preparing (``ready_now``: one this transaction just marked ready); none while
    one is. A replica already running (an agent without the two phases) counts as ready."""
    jobs = await job_repo.get_many(conn, list(alloc.job_ids))
    job = jobs.get(alloc.job_ids[0]) if alloc.job_ids else None
    if job is None or job.job.replicas <= 1:
        return []
    mates = await alloc_repo.get_many(conn, list(job.allocation_ids))
    if len(mates) < job.job.replicas:
        return []  # a replica is gone: the attempt is ending
    ready: list[Allocation] = []
    for rec in mates:
        mate = rec.alloc
        if mate.attempt != alloc.attempt or mate.desired is not AllocDesired.RUN:
            return []
        if mate.observed is AllocObserved.READY or mate.id == ready_now:
            ready.append(mate)
        elif mate.observed is not AllocObserved.RUNNING:
            return []
    return ready
