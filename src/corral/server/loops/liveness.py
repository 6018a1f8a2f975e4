"""The liveness loop: lost nodes, unanswered stops and job timeouts.

Every ``liveness_tick_s`` it looks for

* nodes not heard from for ``node_timeout_s``: marked lost; their
  allocations end as lost and their jobs are requeued (attempt + 1, resuming
  from the last checkpoint) or fail when out of attempts;
* allocations told to stop that have not answered within grace + slack: the
  stop is taken as done, so a silent agent cannot hold a job forever;
* running allocations past their deadline (the jobs' ``timeout_s``): told to
  stop with reason ``timeout``.
* gang replicas not started within ``gang_start_timeout_s``: the gang's attempt
  fails (``services/stragglers.py``).

``tick`` decides from one read and acts in one short transaction per item,
re-checking the condition inside it (the state may have moved on).

**Grace after a start.** Silence is measured from ``max(last_seen, since)``,
where ``since`` is when this process started watching (the plane's start, or
the moment it became the scheduling leader). A server that was down longer
than ``node_timeout_s`` therefore gives agents a full timeout to reconnect
instead of marking every node lost at its first tick; stops sent before the
restart get the same grace. With several replicas only the leader watches
(``leading``), so the fleet is checked once, not once per replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.core.states import AllocDesired, NodeState, StopReason
from corral.server.services.departure import lose_node
from corral.server.services.outcomes import Ending
from corral.server.services.settling import end_allocation, request_stop
from corral.server.services.stragglers import fail_straggler, stragglers
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import AllocRecord, NodeRecord

log = logging.getLogger("corral.server.liveness")


@dataclass
class TickReport:
    lost_nodes: list[str] = field(default_factory=list)
    forced_stops: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    stragglers: list[str] = field(default_factory=list)


class LivenessLoop:
    def __init__(self, rt: Runtime, leading: Callable[[], bool] | None = None) -> None:
        self.rt = rt
        self.leading = leading or (lambda: True)
        self.since = rt.clock.now()  # silence before this is not counted (see the module doc)
        self._was_leading = True

    def watch_from(self, at: float) -> None:
        """Count silence only from ``at`` (the plane's start)."""
        self.since = at

    async def run(self) -> None:
        while True:
            await self.rt.clock.sleep(self.rt.settings.scheduling.liveness_tick_s)
            try:
                await self.tick()
            except Exception:  # keep watching even if one tick hits a bad row
                log.exception("liveness tick failed")

    async def tick(self) -> TickReport:
        s = self.rt.settings.scheduling
        now = self.rt.clock.now()
        report = TickReport()
        if not self._lead(now):
            return report
        async with self.rt.db.read() as conn:
            nodes = await node_repo.all_nodes(conn)
            active = await alloc_repo.active(conn)
        for n in nodes:
            stale = self._silent_for(n.node.last_seen, now) > s.node_timeout_s
            if n.node.state is NodeState.READY and stale and await self.mark_lost(n.node.name):
                report.lost_nodes.append(n.node.name)
        lost = set(report.lost_nodes)
        for rec in active:
            if rec.alloc.node in lost:
                continue
            overdue = _stop_overdue(rec, now, s.stop_slack_s, self.since)
            if overdue and await self._force_end(rec.alloc.id):
                report.forced_stops.append(rec.alloc.id)
            elif _past_deadline(rec, now) and await self._time_out(rec.alloc.id):
                report.timed_out.append(rec.alloc.id)
        for alloc_id in stragglers(active, now, s.gang_start_timeout_s):
            if await fail_straggler(self.rt, alloc_id, s.gang_start_timeout_s):
                report.stragglers.append(alloc_id)
        return report

    def _lead(self, now: float) -> bool:
        """Only the leader watches; a new leader starts its grace now."""
        leading = self.leading()
        if leading and not self._was_leading:
            self.since = now
        self._was_leading = leading
        return leading

    def _silent_for(self, last_seen: float, now: float) -> float:
        return now - max(last_seen, self.since)

    async def mark_lost(self, name: str) -> bool:
        """Mark ``name`` lost and end its allocations as lost. False if it came back meanwhile."""
        timeout = self.rt.settings.scheduling.node_timeout_s

        def silent(rec: NodeRecord, now: float) -> bool:
            return self._silent_for(rec.node.last_seen, now) > timeout

        if not await lose_node(self.rt, name, "timeout", silent):
            return False
        log.warning("node %s lost: not heard from for %.0fs", name, timeout)
        return True

    async def _force_end(self, alloc_id: str) -> bool:
        slack = self.rt.settings.scheduling.stop_slack_s
        async with self.rt.tx() as tx:
            rec = await alloc_repo.get(tx.conn, alloc_id)
            overdue = rec is not None and _stop_overdue(rec, tx.now, slack, self.since)
            if rec is None or not rec.alloc.active or not overdue:
                return False
            log.warning("allocation %s did not answer its stop; taking it as stopped", alloc_id)
            await end_allocation(self.rt, tx, rec, Ending.STOPPED)
        return True

    async def _time_out(self, alloc_id: str) -> bool:
        grace = self.rt.settings.scheduling.stop_grace_s
        async with self.rt.tx() as tx:
            rec = await alloc_repo.get(tx.conn, alloc_id)
            if rec is None or not rec.alloc.active or not _past_deadline(rec, tx.now):
                return False
            return await request_stop(self.rt, tx, rec, StopReason.TIMEOUT, grace)


def _stop_overdue(rec: AllocRecord, now: float, slack: float, since: float) -> bool:
    if rec.alloc.desired is AllocDesired.RUN or rec.stop_at is None:
        return False
    return now > max(rec.stop_at, since) + (rec.stop_grace_s or 0.0) + slack


def _past_deadline(rec: AllocRecord, now: float) -> bool:
    return (
        rec.alloc.desired is AllocDesired.RUN
        and rec.deadline_at is not None
        and now > rec.deadline_at
    )
