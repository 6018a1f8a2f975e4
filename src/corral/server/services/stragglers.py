"""Gang replicas that do not start: the attempt fails, not the cluster.

A gang trains only once every replica has started; a replica stuck before its
start (its node cannot fetch the checkpoint, a download hangs, its agent took
the order and went quiet without being lost) would keep the others waiting in
their rendezvous for ever. After ``scheduling.gang_start_timeout_s`` the
straggler's allocation ends as a retryable failure, which requeues the gang as
one (the other replicas are stopped by ``settling``), and its agent is told to
drop it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence

from corral.core.errors import LinkError
from corral.core.states import AllocDesired, AllocObserved, StopReason
from corral.server.agentlink.base import StopOrder
from corral.server.services.outcomes import Ending
from corral.server.services.settling import end_allocation
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store.records import AllocRecord


def stragglers(active: Sequence[AllocRecord], now: float, timeout_s: float) -> list[str]:
    """Allocations of gangs (several active allocations of the same jobs) still pending
    ``timeout_s`` after they were placed."""
    sizes = Counter(rec.alloc.job_ids for rec in active)
    return [
        rec.alloc.id
        for rec in active
        if sizes[rec.alloc.job_ids] > 1 and _straggling(rec, now, timeout_s)
    ]


async def fail_straggler(rt: Runtime, alloc_id: str, timeout_s: float) -> bool:
    """End ``alloc_id`` as a failed start if it still straggles; False if it moved on."""
    async with rt.tx() as tx:
        rec = await alloc_repo.get(tx.conn, alloc_id)
        if rec is None or not _straggling(rec, tx.now, timeout_s):
            return False
        why = f"replica {rec.alloc.replica} did not start within {timeout_s:g}s"
        await end_allocation(rt, tx, rec, Ending.FAILED, retryable=True, error=why)
        order = StopOrder(rec.alloc.id, StopReason.CANCEL, rt.settings.scheduling.stop_grace_s)

        async def drop() -> None:
            with contextlib.suppress(LinkError):  # not connected: its next hello drops it
                await rt.link.stop(rec.alloc.node, order)

        tx.then(drop)
    return True


def _straggling(rec: AllocRecord, now: float, timeout_s: float) -> bool:
    alloc = rec.alloc
    return (
        alloc.active
        and alloc.observed is AllocObserved.PENDING
        and alloc.desired is AllocDesired.RUN
        and now > rec.created_at + timeout_s
    )
