"""Nodes that fail everything they are given are paused, with the reason shown.

A machine with a broken driver, a full disk or a dying card fails every job
it gets, fast, and so would drain the whole queue into failures. Each node
counts the jobs that failed on it in a row (a success resets the count);
at ``scheduling.node_failure_pause`` it is paused automatically: no new
work, running work continues, the agent's intake closes, the node's JSON
shows ``pause_reason`` and a ``node.paused`` event says why. An admin's
``POST /v1/nodes/{name}/resume`` clears it.

Only failures the agent reports for work it was told to run, and that are
retryable, count: a job refusing its own bad input (not retryable) says
nothing about the node, and neither do stops, preemptions or lost nodes.
"""

from __future__ import annotations

import logging

from corral.core.events import EventKind
from corral.server.services.unit import Runtime, Tx
from corral.server.store import nodes as node_repo

log = logging.getLogger("corral.server.nodes")


def pause_reason(streak: int, limit: int, error: str | None) -> str | None:
    """The reason to pause a node that has now failed ``streak`` jobs in a row, or None."""
    if limit <= 0 or streak < limit:
        return None
    last = f" (last: {error[:200]})" if error else ""
    return f"paused automatically: {streak} jobs in a row failed on this node{last}"


async def note_outcome(rt: Runtime, tx: Tx, node: str, *, ok: bool, error: str | None) -> None:
    """Count a job that failed (``ok=False``) or succeeded on ``node``; pause it at the limit.

    Best effort: if the node row changed meanwhile (a hello), this one outcome is not counted.
    """
    if ok:  # the common case: one statement (a round trip on PostgreSQL), no read first
        await node_repo.reset_streak(tx.conn, node)
        return
    rec = await node_repo.get(tx.conn, node)
    if rec is None:
        return
    streak = rec.failure_streak + 1
    reason = None
    if not rec.node.paused:
        reason = pause_reason(streak, rt.settings.scheduling.node_failure_pause, error)
    values: dict[str, object] = {"failure_streak": streak}
    if reason is not None:
        values |= {"paused": True, "pause_reason": reason}
    if not await node_repo.update(tx.conn, rec, **values) or reason is None:
        return
    tx.emit(EventKind.NODE_PAUSED, team=None, node=node, paused=True, auto=True, reason=reason)
    tx.reschedule = True
    log.warning("node %s %s", node, reason)

    async def close_intake() -> None:
        await rt.link.set_intake(node, open=False)

    tx.then(close_intake)
