"""The scheduling loop: catch up with the store -> decide -> verify + apply -> tell agents.

It runs when something changed (a submission, a node joining or changing,
an allocation ending: anything that fires ``Runtime.schedule_needed``),
paced (``pacing.py``) so that a burst of changes costs one cycle, plus a slow
idle cycle as a safety net and a timer for the first instant at which time
alone may change the plan (``Scheduler.wake_at``: a retry backoff ending, a
victim passing its minimum run time). Never a fixed fast sleep.

Only the leader schedules (``leader.py``). It keeps a ``Scheduler`` between
cycles (``kept.py``) and tells it, before each cycle, what changed in the
store (``changes.py``): a cycle costs what changed, not the size of the queue.
A new leader starts from an empty one, which its first catch-up fills from
the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import EMPTY
from corral.core.resources import MILLI
from corral.scheduler.api import Config, Plan, ReasonCode, Remedy, Snapshot, Unplaced
from corral.scheduler.explain import simple
from corral.scheduler.served import ServiceLedger
from corral.server.loops.etas import EtaKeeper
from corral.server.loops.kept import Kept
from corral.server.loops.leader import AlwaysLeader, Leadership
from corral.server.loops.pacing import Pacing
from corral.server.services.placement import Applied, apply_plan
from corral.server.services.policy import PolicyService
from corral.server.services.unit import Runtime
from corral.server.store import jobs as job_repo
from corral.server.store import sql
from corral.server.store.records import JobRecord

log = logging.getLogger("corral.server.schedule")

INLINE_WORK = 4096
"""Queued jobs x nodes up to which ``schedule`` runs on the loop itself (well under a
millisecond); larger cycles run on a thread so the API stays responsive meanwhile."""

FORGET_EVERY = 10_000  # queue changes (SQLite's ``job_changes``) followed between deletions


class SchedulingLoop:
    """Owns the cycle and remembers the last plan's reasons for ``GET /v1/queue``."""

    def __init__(
        self, rt: Runtime, leader: Leadership | None = None, policy: PolicyService | None = None
    ) -> None:
        self.rt = rt
        self.policy = policy or PolicyService(rt)  # read again at every cycle's catch-up
        self.leader = leader or AlwaysLeader()
        self.leading = False
        self.unplaced: dict[str, Unplaced] = {}
        self._making_room: dict[str, Unplaced] = {}  # jobs waiting for their victims to stop
        self.cycles = 0
        self.kept = Kept(self.config(), rt.policy)
        self._built_for = rt.policy_version  # the policy version the kept scheduler follows
        self.pacing = Pacing(rt.settings.scheduling)
        self.service = ServiceLedger()  # who was served lately: fairness across cycles
        self.eta = EtaKeeper(rt)  # expected starts and ends (``GET /v1/jobs/{id}``, queue)
        self._forgot = 0  # ``job_changes`` rows up to this one are deleted
        self._one_at_a_time = asyncio.Lock()
        self._reader: AsyncConnection | None = None  # SQLite: the cycles' kept read connection
        self._next_timer: float | None = None
        # Models (issue 10): registry sizes for the scheduler; what runs after each cycle.
        self.model_sizes: Callable[[AsyncConnection], Awaitable[Mapping[str, int]]] | None = None
        self.after_cycle: list[Callable[[Snapshot, Plan], Awaitable[object]]] = []
        self._last_try = float("-inf")  # a follower's last attempt to become the leader
        # A follower that was poked (work arrived here) asks the leader for a cycle.
        self.on_follow: Callable[[], None] | None = None

    def config(self) -> Config:
        """The settings' knobs, with what the policy in force sets (``policy_doc.Policy``)."""
        s, m = self.rt.settings.scheduling, self.rt.settings.models
        base = Config(
            max_batch_size=s.max_batch_size,
            preemption=s.preemption,
            min_runtime_before_preemption_s=s.min_runtime_before_preemption_s,
            model_fetch_bytes_per_s=m.fetch_bytes_per_s if m.routing else None,
            model_load_bytes_per_s=m.load_bytes_per_s,
            model_max_wait_s=m.max_wait_s,
        )
        return self.rt.policy.config(base)

    @property
    def last_cycle_s(self) -> float:
        return self.pacing.last_cycle_s

    @property
    def explain_every(self) -> float:
        return self.pacing.explain_every

    @property
    def wake_at(self) -> float | None:
        """When the loop next wakes with no trigger, short of the idle cycle: the first
        instant at which time alone may change the last cycle's plan (None: none)."""
        return self._next_timer

    def rebuild(self) -> None:
        """Forget the kept state: the next catch-up reads it all from the store again."""
        self.kept = Kept(self.config(), self.rt.policy)
        self._built_for = self.rt.policy_version

    async def run(self) -> None:
        """Forever: wait for a trigger (or the idle timeout), pace, run a cycle."""
        trigger = self.rt.schedule_needed
        while True:
            fired = await trigger.wait(self._wait_s())
            pause = self.pacing.pause_s()
            if pause > 0:
                await self.rt.clock.sleep(pause)
            trigger.clear()
            try:
                if self.leading:  # still? asked beside the catch-up's read (``cycle``)
                    await self.cycle(confirm=True)
                elif await self._lead():
                    await self.cycle()
                if not self.leading:
                    self.rt.work_waiting = True  # a follower forwards every change to the leader
                    if fired and self.on_follow is not None:
                        self.on_follow()
            except Exception:  # a bad cycle must not stop scheduling forever
                log.exception("scheduling cycle failed; retrying")
                self.rt.work_waiting = True
                self.rebuild()
                await self.rt.clock.sleep(1.0)
                trigger.fire()

    async def _lead(self) -> bool:
        """Are we the leader? A new leader starts from an empty kept scheduler.

        A follower tries for the lock at most every ``leader_retry_s``, however
        often it is poked: the leader dying is noticed within that time.
        """
        now = self.rt.clock.now()
        if not self.leading and now - self._last_try < self.rt.settings.scheduling.leader_retry_s:
            return False
        self._last_try = now
        leading = await self.leader.acquire()
        if leading and not self.leading:
            self.rebuild()
            log.info("leading the scheduling loop")
        self.leading = leading
        self.rt.metrics.leader.set(1 if leading else 0)
        return leading

    def _wait_s(self) -> float:
        idle = self.rt.settings.scheduling.idle_cycle_s
        if not self.leading:
            idle = min(idle, self.rt.settings.scheduling.leader_retry_s)
        if self._next_timer is None:
            return idle
        return max(0.0, min(idle, self._next_timer - self.rt.clock.now()))

    async def cycle(self, *, confirm: bool = False) -> Applied:
        """One cycle. Public so tests can drive it directly.

        ``confirm``: first make sure this replica still leads, asking beside the
        catch-up's read (two connections, one round trip's wait instead of two); one that
        lost the lead places nothing.
        """
        async with self._one_at_a_time:
            started = time.perf_counter()
            async with self._reading() as conn:
                if confirm and not isinstance(self.leader, AlwaysLeader):
                    leading, _ = await asyncio.gather(self._lead(), self._catch_up(conn))
                    if not leading:
                        return Applied()
                else:
                    await self._catch_up(conn)
            applied = await self._decide(started)
            await self._forget_followed()
            return applied

    async def snapshot(self) -> Snapshot:
        """The store's state as the kept scheduler holds it, caught up now (for tests)."""
        async with self._one_at_a_time, self._reading() as conn:
            await self._catch_up(conn)
        return self.kept.snapshot()

    async def _catch_up(self, conn: AsyncConnection) -> None:
        await self.policy.refresh(conn)
        if self.rt.policy_version != self._built_for:  # a new policy: a scheduler set by it
            self.rebuild()
        sizes = EMPTY if self.model_sizes is None else await self.model_sizes(conn)
        await self.kept.catch_up(conn, sizes)

    async def _decide(self, started: float) -> Applied:
        """One decision on the kept scheduler, then the plan applied."""
        now = self.rt.clock.now()
        kept = self.kept
        sched = kept.scheduler
        sched.served = self.service.view(now)
        queued = kept.queued
        explain = self.pacing.explain_due(queued, now)
        if queued * max(1, len(sched.nodes)) <= INLINE_WORK:
            plan = sched.schedule(now, self.rt.settings.scheduling.seed, explain=explain)
        else:  # keep the API serving meanwhile
            plan = await asyncio.to_thread(
                sched.schedule, now, self.rt.settings.scheduling.seed, explain=explain
            )
        records = kept.records
        applied = await apply_plan(self.rt, plan, records)
        kept.placed(applied.inserted)
        kept.set_aside(applied.awaiting, plan.placements, now)
        self._room_made(plan, applied.awaiting)
        self._served(records, applied, now)
        self._remember(plan, now, explain, queued)
        if self.after_cycle:  # e.g. the prefetch policy (loops/prefetch.py)
            snapshot = kept.snapshot()
            for follow_up in self.after_cycle:
                await follow_up(snapshot, plan)
        if self.eta.due(sched.queue.jobs, now):
            seed = self.rt.settings.scheduling.seed
            snapshot = replace(kept.snapshot(), served=self.service.view(now))  # with this cycle's
            await self.eta.refresh(snapshot, kept.config, now, seed)
        # A row that moved on since the catch-up (a job cancelled meanwhile) reaches the
        # scheduler with the next one, as any change does.
        if applied.stale or any(_hit_cycle_limit(u) for u in plan.unplaced):
            self.rt.schedule_needed.fire()  # something moved on, or more fits: go again
        self.cycles += 1
        self.pacing.ended(started, queued, explain, now)
        self.rt.metrics.cycle_seconds.observe(self.pacing.last_cycle_s)
        return applied

    def _served(self, records: Mapping[str, JobRecord], applied: Applied, now: float) -> None:
        """Record each placed job's user in the service ledger."""
        for assignment in applied.placed:
            for work in assignment.jobs:
                rec = records.get(work.job_id)
                if rec is not None:
                    self.service.record(rec.job.user, now)

    def _remember(self, plan: Plan, now: float, explained: bool, offered: int) -> None:
        """Keep the cycle's reasons (``GET /v1/queue``) and what the next cycle waits for.
        ``offered``: the queued jobs the cycle was given (not those set aside)."""
        placed = {j for p in plan.placements for j in p.job_ids}
        kept = self.kept
        if explained:
            self.unplaced = {u.job_id: u for u in plan.unplaced}
            queued = (r.job for r in kept.records.values())
            self.rt.metrics.observe_queue(j for j in queued if j.id not in placed)
        else:  # the last explained cycle's reasons, less the jobs placed since
            for job_id in placed:
                self.unplaced.pop(job_id, None)
            self.unplaced.update((u.job_id, u) for u in plan.unplaced)
        # The first instant at which time alone may change the plan (a backoff ending, a
        # victim passing its minimum run time, a model wait running out): the loop wakes for
        # it, as the simulator does (``scheduler.timers``), not at the next idle cycle.
        self._next_timer = kept.scheduler.wake_at(now)
        self._capped(offered)
        for job_id in [j for j in self._making_room if j not in kept.awaiting]:
            del self._making_room[job_id]
        self.unplaced.update(self._making_room)
        left = offered > len(placed)  # what an explained cycle would leave unplaced
        waiting = kept.awaiting or kept.capped  # an allocation's end may let them go
        self.rt.work_waiting = bool(left or waiting or self._next_timer is not None)
        self.rt.metrics.observe_nodes(kept.scheduler.nodes)

    def _capped(self, offered: int) -> None:
        """The reason of each job set aside for its user's cap on running GPUs."""
        caps = self.kept.user_caps
        for i, job in enumerate(self.kept.capped.values()):
            gpus = caps.get(job.user, 0) / MILLI
            text = f"user {job.user} holds its cap of {gpus:g} running GPUs (the policy)"
            reasons, remedy = simple(ReasonCode.QUOTA_EXCEEDED, text, Remedy.WAIT)
            self.unplaced[job.id] = Unplaced(job.id, offered + i, reasons, remedy)

    def _room_made(self, plan: Plan, awaiting: Mapping[str, frozenset[str]]) -> None:
        """What the queue says of each job whose placement waits for work to stop: how many
        allocations, and whether they are evicted or moved (consolidation)."""
        for job_id, victims in awaiting.items():
            stops = [p for p in plan.preemptions if p.for_job == job_id]
            if not stops:  # a batch's rider: its lead's placement waits
                continue
            moves = sum(1 for p in stops if p.move_to)
            kind = "moves to another node (consolidation)" if moves else "stops (preemption)"
            count = len(victims)
            text = (
                f"placed on {stops[0].node} once {count} allocation{'s' if count != 1 else ''} "
                f"there {kind}"
            )
            reasons, remedy = simple(ReasonCode.MAKING_ROOM, text, Remedy.WAIT)
            self._making_room[job_id] = Unplaced(job_id, 0, reasons, remedy)

    async def _forget_followed(self) -> None:
        """Delete the queue's changes the cycles have followed (SQLite), every
        ``FORGET_EVERY`` of them: one short write now and then."""
        mark = self.kept.feed.queue.mark
        if mark is None or mark - self._forgot < FORGET_EVERY:
            return
        async with self.rt.db.write(ordered_events=False, durable=False) as conn:
            db = sql.sqlite_connection(conn)
            if db is not None:
                job_repo.forget_queue_changes(db, mark)
        self._forgot = mark

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[AsyncConnection]:
        """The cycle's reads. On SQLite one connection kept across cycles: checking one out
        of the pool and resetting it on return was 0.1-0.2 ms of a one-job cycle (of ~0.7).
        Its read transaction ends with each cycle, so it never holds the WAL back. On
        PostgreSQL, the pool's (``Database.read``)."""
        db = self.rt.db
        if db.is_postgres:
            async with db.read() as conn:
                yield conn
            return
        if self._reader is None:
            self._reader = await db.engine.connect()
        try:
            yield self._reader
        except BaseException:
            await self.close()  # a failed or cancelled read: start from a fresh connection
            raise
        if self._reader.in_transaction():  # a read through SQLAlchemy began one: end it
            await self._reader.rollback()

    async def close(self) -> None:
        """Give back the kept read connection (the server is stopping)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()


def _hit_cycle_limit(u: Unplaced) -> bool:
    return any(r.code is ReasonCode.CYCLE_LIMIT for r in u.reasons)
