"""The scheduling loop: snapshot -> ``schedule`` -> verify + apply -> tell agents.

It runs when something changed (a submission, a node joining or changing,
an allocation ending: anything that fires ``Runtime.schedule_needed``),
debounced so that a burst of changes costs one cycle, plus a slow idle cycle
as a safety net and a timer for the earliest retry backoff. Never a fixed
fast sleep.

Correctness first: each cycle reads the snapshot from the store (queued jobs,
active allocations, nodes, teams). The derived in-memory snapshot of
DESIGN.md section 2 can replace ``load_snapshot`` behind the same interface.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.scheduler.api import Config, Plan, ReasonCode, Snapshot, Unplaced
from corral.server.services.placement import Applied, apply_plan
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo

log = logging.getLogger("corral.server.schedule")

ScheduleFn = Callable[[Snapshot, Config, float, int], Plan]


@dataclass(frozen=True, slots=True)
class Loaded:
    snapshot: Snapshot
    versions: dict[str, int]  # job id -> row version the snapshot saw
    order: tuple[str, ...]  # queued job ids in submission order


async def load_snapshot(conn: AsyncConnection) -> Loaded:
    """Read what the scheduler decides about, in one read transaction."""
    queued = await job_repo.queued(conn)
    active = await alloc_repo.active(conn)
    nodes = await node_repo.all_nodes(conn)
    teams = await node_repo.all_teams(conn)
    snapshot = Snapshot(
        nodes=tuple(n.node for n in nodes),
        queued=tuple(r.job for r in queued),
        allocations=tuple(a.alloc for a in active),
        teams=tuple(teams),
    )
    return Loaded(snapshot, {r.job.id: r.version for r in queued}, tuple(r.job.id for r in queued))


class SchedulingLoop:
    """Owns the cycle and remembers the last plan's reasons for ``GET /v1/queue``."""

    def __init__(self, rt: Runtime, schedule: ScheduleFn) -> None:
        self.rt = rt
        self.schedule = schedule
        self.unplaced: dict[str, Unplaced] = {}
        self.awaiting: dict[str, frozenset[str]] = {}  # job -> victims still stopping
        self.cycles = 0
        self._next_timer: float | None = None

    def config(self) -> Config:
        s = self.rt.settings.scheduling
        return Config(
            priority_classes=self.rt.priority_classes,
            max_batch_size=s.max_batch_size,
            preemption=s.preemption,
        )

    async def run(self) -> None:
        """Forever: wait for a trigger (or the idle timeout), debounce, run a cycle."""
        trigger = self.rt.schedule_needed
        while True:
            await trigger.wait(self._wait_s())
            debounce = self.rt.settings.scheduling.debounce_s
            if debounce:
                await self.rt.clock.sleep(debounce)  # let the rest of a burst arrive
            trigger.clear()
            try:
                await self.cycle()
            except Exception:  # a bad cycle must not stop scheduling forever
                log.exception("scheduling cycle failed; retrying")
                await self.rt.clock.sleep(1.0)
                trigger.fire()

    def _wait_s(self) -> float:
        idle = self.rt.settings.scheduling.idle_cycle_s
        if self._next_timer is None:
            return idle
        return max(0.0, min(idle, self._next_timer - self.rt.clock.now()))

    async def cycle(self) -> Applied:
        """One cycle. Public so tests (and a future leader election) can drive it directly."""
        started = time.perf_counter()
        async with self.rt.db.read() as conn:
            loaded = await load_snapshot(conn)
        now = self.rt.clock.now()
        snapshot = self._without_awaiting(loaded.snapshot)
        plan = await asyncio.to_thread(
            self.schedule, snapshot, self.config(), now, self.rt.settings.scheduling.seed
        )
        applied = await apply_plan(self.rt, plan, loaded.versions)
        self.awaiting.update(applied.awaiting)
        self._remember(loaded, plan, now)
        if applied.stale or any(_hit_cycle_limit(u) for u in plan.unplaced):
            self.rt.schedule_needed.fire()  # something moved on, or more fits: go again
        self.cycles += 1
        self.rt.metrics.cycle_seconds.observe(time.perf_counter() - started)
        return applied

    def _without_awaiting(self, snapshot: Snapshot) -> Snapshot:
        """Hide jobs whose preemption victims are still stopping; forget those whose are gone."""
        active = {a.id for a in snapshot.allocations}
        self.awaiting = {j: v for j, v in self.awaiting.items() if v & active}
        if not self.awaiting:
            return snapshot
        queued = tuple(j for j in snapshot.queued if j.id not in self.awaiting)
        return replace(snapshot, queued=queued)

    def _remember(self, loaded: Loaded, plan: Plan, now: float) -> None:
        self.unplaced = {u.job_id: u for u in plan.unplaced}
        waiting = [j.not_before for j in loaded.snapshot.queued if j.not_before > now]
        self._next_timer = min(waiting) if waiting else None
        placed = {j for p in plan.placements for j in p.job_ids}
        self.rt.metrics.observe_queue(j for j in loaded.snapshot.queued if j.id not in placed)
        self.rt.metrics.observe_nodes(loaded.snapshot.nodes)


def _hit_cycle_limit(u: Unplaced) -> bool:
    return any(r.code is ReasonCode.CYCLE_LIMIT for r in u.reasons)
