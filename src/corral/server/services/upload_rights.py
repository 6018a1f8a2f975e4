"""Who may upload for which allocation: the agent of the node it is assigned to, for its
current attempt, while it runs.

An agent token is shared by a fleet, so the token alone says nothing about whose work a
call is about. An ``UploadBlob`` call therefore names its node and proves it with the
node's key (the agent sends both as metadata, as its hello does). The server opens
nothing for an upload until this says the allocation is that node's live attempt; a
call about any other allocation (invented, another node's, an older attempt) is refused.
"""

from __future__ import annotations

from corral.server.agentlink.base import Standing
from corral.server.services.node_keys import proves
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo


async def upload_standing(
    rt: Runtime, node: str, key: str, allocation_id: str, attempt: int
) -> Standing:
    """``Standing.LIVE`` for the current, unended attempt of an allocation on ``node``
    (whose ``key`` it must prove); ``ENDED`` once that attempt ended; else ``FOREIGN``."""
    async with rt.db.read() as conn:
        rec = await node_repo.get(conn, node)
        found = await alloc_repo.get(conn, allocation_id)
    if rec is None or not proves(rec, key) or found is None:
        return Standing.FOREIGN
    alloc = found.alloc
    if alloc.node != node or alloc.attempt != attempt:
        return Standing.FOREIGN
    return Standing.LIVE if alloc.active else Standing.ENDED
