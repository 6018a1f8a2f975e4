"""Getting the stored intent to the agents this replica holds.

Two ways in, one rule: read the intent from the store, send it only if it
still holds, and only to a node whose stream is on this replica.

* ``on_notes``: another replica published notes (``store.notify``) for
  assignments, stops or intake changes it could not send itself; a ``kick``
  asks the scheduling leader for a cycle (work arrived at a follower).
* ``resync``: the safety net, run every ``scheduling.resync_s`` on every
  replica. Assignments still pending and stops still unanswered after that
  long are sent again to the nodes held here, and a gang replica waiting
  for its go gets it again once its whole gang is ready, so a lost note or a
  message that died with a stream delays work instead of stranding it. Agents
  ignore an assignment they already hold, a stop for work they already
  stopped and a go for a replica that is not waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import LinkError
from corral.core.states import AllocDesired, AllocObserved, JobState, StopReason
from corral.server.agentlink.base import AgentLink, StopOrder
from corral.server.agentlink.relay import holds
from corral.server.services.gang_start import waiting_for_go
from corral.server.services.placement import assignment
from corral.server.services.rendezvous import master_of
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.notify import Note
from corral.server.store.records import AllocRecord

log = logging.getLogger("corral.server.delivery")

Gang = tuple[tuple[str, ...], int]
"""A gang attempt: its jobs' ids and the attempt number its replicas share."""


class Delivery:
    def __init__(
        self, rt: Runtime, transport: AgentLink, leading: Callable[[], bool] = lambda: True
    ) -> None:
        self.rt = rt
        self.transport = transport  # this replica's own streams (never the relay)
        self.leading = leading
        self.delivered = 0  # messages sent on another replica's behalf or resent

    async def on_notes(self, notes: Sequence[Note]) -> None:
        """Act on other replicas' notes: deliver what concerns nodes held here."""
        for note in notes:
            if note.kind == "kick":
                if self.leading():
                    self.rt.schedule_needed.fire()
            elif holds(self.transport, note.node):
                await self._deliver(note)

    async def _deliver(self, note: Note) -> None:
        async with self.rt.db.read() as conn:
            if note.kind == "intake":
                node = await node_repo.get(conn, note.node)
                if node is not None:
                    closed = node.node.paused or node.node.draining
                    await self._send(self.transport.set_intake(note.node, open=not closed))
                return
            rec = await alloc_repo.get(conn, note.ref)
            if rec is None or rec.alloc.node != note.node or not rec.alloc.active:
                return
            if note.kind == "assign" and _pending(rec):
                await self._assign(conn, rec)
            elif note.kind == "stop" and rec.alloc.desired is not AllocDesired.RUN:
                await self._send(self.transport.stop(note.node, _stop_order(rec)))
            elif note.kind == "stop":  # a job of a batch cancelled on its own
                await self._stop_jobs(conn, rec, older_than_s=-1.0)
            elif note.kind == "go" and rec.alloc.observed is AllocObserved.READY:
                await self._go(conn, rec, {})

    async def resync(self, older_than_s: float) -> int:
        """Send again what has waited longer than ``older_than_s``; returns how many."""
        now = self.rt.clock.now()
        sent = 0
        gangs: dict[Gang, set[str]] = {}  # each waiting gang read once per pass
        async with self.rt.db.read() as conn:
            for rec in await alloc_repo.active(conn):
                if not holds(self.transport, rec.alloc.node):
                    continue
                if _pending(rec) and now - rec.created_at > older_than_s:
                    sent += await self._assign(conn, rec)
                elif _stopping_since(rec, now) > older_than_s:
                    sent += await self._send(self.transport.stop(rec.alloc.node, _stop_order(rec)))
                elif len(rec.alloc.job_ids) > 1:
                    sent += await self._stop_jobs(conn, rec, older_than_s)
                elif rec.alloc.observed is AllocObserved.READY:
                    sent += await self._go(conn, rec, gangs)
        if sent:
            log.info("resent %d assignments and stops to agents held here", sent)
        return sent

    async def _stop_jobs(self, conn: AsyncConnection, rec: AllocRecord, older_than_s: float) -> int:
        """Tell the agent (again) to stop the jobs of batch ``rec`` stopped on their own:
        those cancelled more than ``older_than_s`` ago, and those interrupted (no time is
        kept for an interrupt: every resync pass sends it again while the batch runs). The
        agent ignores a job it stopped or finished."""
        now, grace = self.rt.clock.now(), self.rt.settings.scheduling.stop_grace_s
        sent = 0
        for job in (await job_repo.get_many(conn, rec.alloc.job_ids)).values():
            reason = None
            if job.state is JobState.CANCELLED and now - (job.finished_at or now) > older_than_s:
                reason = StopReason.CANCEL
            elif job.stop_request == StopReason.INTERRUPT.value and job.state is JobState.RUNNING:
                reason = StopReason.INTERRUPT
            if reason is not None:
                order = StopOrder(rec.alloc.id, reason, grace, job.job.id)
                sent += await self._send(self.transport.stop(rec.alloc.node, order))
        return sent

    async def _assign(self, conn: AsyncConnection, rec: AllocRecord) -> int:
        works = list((await job_repo.get_many(conn, rec.alloc.job_ids)).values())
        master = await master_of(conn, rec.alloc, works)
        work = assignment(rec.alloc, works, master=master)
        return await self._send(self.transport.assign(rec.alloc.node, work))

    async def _go(
        self, conn: AsyncConnection, rec: AllocRecord, gangs: dict[Gang, set[str]]
    ) -> int:
        """Say go (again) to a replica whose whole gang is ready (``gang_start.py``).

        ``gangs``: the replicas to say go to of each gang read so far (by its jobs and
        attempt, all ``waiting_for_go`` reads), so a pass reads a gang of N once, not N times.
        """
        gang = (rec.alloc.job_ids, rec.alloc.attempt)
        ready = gangs.get(gang)
        if ready is None:
            ready = gangs[gang] = {m.id for m in await waiting_for_go(conn, rec.alloc)}
        if rec.alloc.id not in ready:
            return 0
        return await self._send(self.transport.go(rec.alloc.node, rec.alloc.id, rec.alloc.attempt))

    async def _send(self, message: Awaitable[None]) -> int:
        try:
            await message
        except LinkError:  # the stream ended meanwhile: its next hello carries the intent
            return 0
        self.delivered += 1
        return 1


def _pending(rec: AllocRecord) -> bool:
    return rec.alloc.observed is AllocObserved.PENDING and rec.alloc.desired is AllocDesired.RUN


def _stopping_since(rec: AllocRecord, now: float) -> float:
    if rec.alloc.desired is AllocDesired.RUN or rec.stop_at is None:
        return -1.0
    return now - rec.stop_at


def _stop_order(rec: AllocRecord) -> StopOrder:
    reason = StopReason(rec.stop_reason or StopReason.CANCEL.value)
    return StopOrder(rec.alloc.id, reason, rec.stop_grace_s or 0.0)
