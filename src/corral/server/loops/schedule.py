"""The scheduling loop: snapshot -> ``schedule`` -> verify + apply -> tell agents.

It runs when something changed (a submission, a node joining or changing,
an allocation ending: anything that fires ``Runtime.schedule_needed``),
rate-limited so that a burst of changes costs one cycle, plus a slow idle cycle
as a safety net and a timer for the earliest retry backoff. Never a fixed
fast sleep.

Each cycle reads the snapshot through ``SnapshotCache``: only rows that are
new or changed since the last cycle are decoded. Cycles are also paced: the
next one starts no sooner after the last one ended than the last one took,
so scheduling never takes more than about half of the process while
submissions pour in; a job arriving at a quiet server is scheduled at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial
from operator import attrgetter

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.scheduler import KeptSchedule
from corral.scheduler.api import Config, Plan, ReasonCode, Snapshot, Unplaced
from corral.scheduler.service import ServiceLedger
from corral.server.loops.leader import AlwaysLeader, Leadership
from corral.server.loops.snapshot import SnapshotCache
from corral.server.services.placement import Applied, apply_plan
from corral.server.services.unit import Runtime, Tx
from corral.server.store import jobs as job_repo
from corral.server.store import sql
from corral.server.store.records import JobRecord

log = logging.getLogger("corral.server.schedule")

ScheduleFn = Callable[[Snapshot, Config, float, int], Plan]

INLINE_WORK = 4096
"""Queued jobs x nodes up to which ``schedule`` runs on the loop itself (well under a
millisecond); larger cycles run on a thread so the API stays responsive meanwhile."""

EXPLAIN_ALWAYS = 256
"""Queued jobs up to which every cycle works out why each job waits. Past it, a cycle
explains at most every ``scheduling.explain_interval_s``, and no more often than keeps
explaining under ``EXPLAIN_SHARE`` of the time: explaining 40,000 waiting jobs took half of
what a cycle cost, every cycle."""

LEAD_CONFIRM_S = 0.25
"""How long a submission's own cycle waits for the leader's lock to say it is still held
(on PostgreSQL; a ``SELECT 1`` answers in well under a millisecond)."""

EXPLAIN_SHARE = 0.05
FORGET_EVERY = 10_000  # queue changes (SQLite's ``job_changes``) followed between deletions
_NOT_BEFORE = attrgetter("not_before")


class SchedulingLoop:
    """Owns the cycle and remembers the last plan's reasons for ``GET /v1/queue``."""

    def __init__(self, rt: Runtime, schedule: ScheduleFn, leader: Leadership | None = None) -> None:
        self.rt = rt
        self.schedule = schedule
        self.leader = leader or AlwaysLeader()
        self.leading = False
        self.unplaced: dict[str, Unplaced] = {}
        self.awaiting: dict[str, frozenset[str]] = {}  # job -> victims still stopping
        self.cycles = 0
        self.cache = SnapshotCache()
        self.service = ServiceLedger()  # who was served lately: fairness across cycles
        self.last_cycle_s = 0.0
        self._cycle_ended = float("-inf")  # perf_counter() when the last cycle ended
        self._explained_at = float("-inf")  # clock time of the last cycle that explained
        self._explain_took = 0.0  # how long that cycle took (s)
        self._forgot = 0  # ``job_changes`` rows up to this one are deleted
        self._burst = False  # the last cycle found more than one job waiting
        self._one_at_a_time = asyncio.Lock()  # a cycle, or ``place_in``'s, at a time
        self._reader: AsyncConnection | None = None  # SQLite: the cycles' kept read connection
        self._next_timer: float | None = None
        # Models (issue 10): registry sizes for the snapshot; what runs after each cycle.
        self.model_sizes: Callable[[AsyncConnection], Awaitable[Mapping[str, int]]] | None = None
        self.after_cycle: list[Callable[[Snapshot, Plan], Awaitable[object]]] = []
        self._last_try = float("-inf")  # a follower's last attempt to become the leader
        # A follower that was poked (work arrived here) asks the leader for a cycle.
        self.on_follow: Callable[[], None] | None = None

    def config(self) -> Config:
        s, m = self.rt.settings.scheduling, self.rt.settings.models
        return Config(
            priority_classes=self.rt.priority_classes,
            max_batch_size=s.max_batch_size,
            preemption=s.preemption,
            model_fetch_bytes_per_s=m.fetch_bytes_per_s if m.routing else None,
            model_load_bytes_per_s=m.load_bytes_per_s,
            model_max_wait_s=m.max_wait_s,
        )

    async def run(self) -> None:
        """Forever: wait for a trigger (or the idle timeout), debounce, run a cycle."""
        trigger = self.rt.schedule_needed
        while True:
            fired = await trigger.wait(self._wait_s())
            pause = self.pause_s()
            if pause > 0:
                await self.rt.clock.sleep(pause)
            trigger.clear()
            try:
                if self.leading:  # still? asked beside the snapshot's read (``cycle``)
                    await self.cycle(confirm=True)
                elif await self._lead():
                    await self.cycle()
                if not self.leading:
                    self.rt.work_waiting = True  # a follower forwards every change to the leader
                    self.rt.fresh_jobs.clear()  # only the leader's snapshot takes them
                    self.rt.fresh_allocs.clear()
                    if fired and self.on_follow is not None:
                        self.on_follow()
                    continue
            except Exception:  # a bad cycle must not stop scheduling forever
                log.exception("scheduling cycle failed; retrying")
                self.rt.work_waiting = True
                self.cache.rebuild()
                await self.rt.clock.sleep(1.0)
                trigger.fire()

    def pause_s(self) -> float:
        """How long until the next cycle may start (0 or less: now).

        Never cycle back to back: cycles start at least the last one's length apart, so
        scheduling takes at most about half of the process (pacing), and while work
        arrives in bursts (the last cycle found more than one job waiting) at least
        debounce_s apart, so a burst gathers into one cycle. A job arriving at a quiet
        server (the last cycle found at most one) is scheduled at once.
        """
        debounce = self.rt.settings.scheduling.debounce_s if self._burst else 0.0
        spacing = max(debounce, self.last_cycle_s)
        return spacing - (time.perf_counter() - self._cycle_ended)

    async def _lead(self) -> bool:
        """Are we the leader? A new leader starts from a fresh snapshot.

        A follower tries for the lock at most every ``leader_retry_s``, however
        often it is poked: the leader dying is noticed within that time.
        """
        now = self.rt.clock.now()
        if not self.leading and now - self._last_try < self.rt.settings.scheduling.leader_retry_s:
            return False
        self._last_try = now
        leading = await self.leader.acquire()
        if leading and not self.leading:
            self.cache.rebuild()
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
        """One cycle. Public so tests (and a future leader election) can drive it directly.

        ``confirm``: first make sure this replica still leads, asking beside the
        snapshot's read (two connections, one round trip's wait instead of two); one that
        lost the lead places nothing.
        """
        async with self._one_at_a_time:
            started = time.perf_counter()
            async with self._reading() as conn:
                if confirm and not isinstance(self.leader, AlwaysLeader):
                    leading, (snapshot, records) = await asyncio.gather(
                        self._lead(), self._load(conn)
                    )
                    if not leading:
                        return Applied()
                else:
                    snapshot, records = await self._load(conn)
            applied = await self._decide(snapshot, records, started)
            await self._forget_followed()
            return applied

    async def _forget_followed(self) -> None:
        """Delete the queue's changes the cycles have followed (SQLite), every
        ``FORGET_EVERY`` of them: one short write now and then."""
        mark = self.cache.queue.mark
        if mark is None or mark - self._forgot < FORGET_EVERY:
            return
        async with self.rt.db.write(ordered_events=False, durable=False) as conn:
            db = sql.sqlite_connection(conn)
            if db is not None:
                job_repo.forget_queue_changes(db, mark)
        self._forgot = mark

    async def place_in(self, tx: Tx, gathered: bool = False) -> bool:
        """Run a cycle inside ``tx``, a group of submissions' open transaction; True if it ran.

        Only when nothing else waits: leading, no cycle under way, and the last cycle left
        nothing waiting, so the cycle sees just these submissions and the store's state,
        read through ``tx``'s own connection. A lone submission (not ``gathered``) is placed
        so only on a quiet server: the last cycle found at most one job (not a burst,
        which the loop's debounce gathers into one cycle). A ``gathered`` group is such a
        burst already (the submissions that queued while the last group committed), so its
        own cycle replaces the loop's, its commit, and the wait for it, when the loop's
        pacing would let a cycle start now (``pause_s``): a stream of small groups is
        still scheduled at the loop's pace, not a cycle per group. The jobs are then
        inserted and placed in one commit, and their assignments leave as that commit is
        made (on SQLite before its fsync). What the cycle wrote is undone (a savepoint) if
        it fails: the submissions stand, and the loop schedules them as usual.
        On PostgreSQL the leadership is confirmed as the loop's cycle confirms it (the
        advisory lock's connection answers), while the snapshot is read: a replica that
        lost it places nothing.
        """
        if not self.rt.settings.scheduling.place_on_submit or not self.leading:
            return False
        if self._one_at_a_time.locked() or self.rt.work_waiting:
            return False
        if (self.pause_s() > 0) if gathered else self._burst:
            return False
        savepoint = _Savepoint.of(tx.conn)
        if savepoint is None:  # a connection the store does not run itself (tests)
            return False
        async with self._one_at_a_time:  # free: taken without waiting
            started = time.perf_counter()
            mark = tx.mark()
            await savepoint.take()
            try:
                if savepoint.pg:  # one round trip to the lock's connection, beside the read
                    leading, (snapshot, records) = await asyncio.gather(
                        self._confirm_lead(), self._load(tx.conn, advance=False)
                    )
                    if not leading:
                        self.cache.rebuild()  # what it read may be seen by the new leader
                        return False
                else:
                    snapshot, records = await self._load(tx.conn, advance=False)
                await self._decide(snapshot, records, started, tx)
                tx.at_commit(self._confirm(self.cache.queue.unconfirmed))
            except Exception:
                await savepoint.undo()
                tx.undo_since(mark)
                self.cache.rebuild()
                log.exception("scheduling inside a submission failed; the loop schedules it")
                return False
            finally:
                await savepoint.release()
        return True

    async def _confirm_lead(self) -> bool:
        """``_lead`` from inside a submission's transaction, which holds the event-ordering
        lock meanwhile: an answer slower than ``LEAD_CONFIRM_S`` counts as no (the loop asks
        again, holding nothing), so a lock connection that hangs cannot hold every writer."""
        try:
            async with asyncio.timeout(LEAD_CONFIRM_S):
                return await self._lead()
        except TimeoutError:
            log.warning("the leader's lock did not answer within %.2f s", LEAD_CONFIRM_S)
            self.leading = False
            return False

    def _confirm(self, mark: int | None) -> Callable[[], Awaitable[None]]:
        """After the submission's commit: the queue's changes ``place_in`` read are kept."""

        async def confirm() -> None:
            self.cache.queue.confirm(mark)

        return confirm

    async def _load(
        self, conn: AsyncConnection, *, advance: bool = True
    ) -> tuple[Snapshot, dict[str, JobRecord]]:
        rt = self.rt
        snapshot, records = await self.cache.load(
            conn, rt.fresh_jobs, rt.fresh_allocs, advance=advance
        )
        if self.model_sizes is not None:  # the registry's sizes, for model-aware routing
            snapshot = replace(snapshot, model_sizes=await self.model_sizes(conn))
        return snapshot, records

    async def _decide(
        self,
        snapshot: Snapshot,
        records: dict[str, JobRecord],
        started: float,
        within: Tx | None = None,
    ) -> Applied:
        """``schedule`` on ``snapshot``, then apply the plan (in ``within``, when given)."""
        now = self.rt.clock.now()
        seen, seed = self._without_awaiting(snapshot), self.rt.settings.scheduling.seed
        seen = replace(seen, served=self.service.view(now))
        self._burst = len(seen.queued) > 1
        explain = self._explain_due(len(seen.queued), now)
        decide = self.schedule
        if isinstance(decide, KeptSchedule):  # what changed since the last snapshot, if known
            delta = self.cache.delta if seen.queued is snapshot.queued else None
            decide = partial(decide, explain=None if explain else False, delta=delta)
        if len(seen.queued) * max(1, len(seen.nodes)) <= INLINE_WORK:
            plan = decide(seen, self.config(), now, seed)  # a thread hop costs more
        else:  # keep the API serving meanwhile
            plan = await asyncio.to_thread(decide, seen, self.config(), now, seed)
        # Inside a transaction that read the snapshot, its nodes are as the store has them.
        nodes = snapshot.nodes if within is not None else ()
        applied = await apply_plan(self.rt, plan, records, within, nodes)
        self._served(records, applied, now)
        self.awaiting.update(applied.awaiting)
        self._remember(snapshot, plan, now, explain, len(seen.queued))
        for follow_up in self.after_cycle:  # e.g. the prefetch policy (loops/prefetch.py)
            if within is None:
                await follow_up(snapshot, plan)
            else:  # not inside the submission's transaction: once it committed
                within.at_commit(_after(follow_up, snapshot, plan))
        if applied.stale:  # a row moved on unseen (a transaction read here rolled back?)
            self.cache.queue.reset()  # the next cycle reads the whole queue once
        if applied.stale or any(_hit_cycle_limit(u) for u in plan.unplaced):
            self.rt.schedule_needed.fire()  # something moved on, or more fits: go again
        self.cycles += 1
        self._cycle_ended = time.perf_counter()  # for the pacing of the next (``pause_s``)
        self.last_cycle_s = self._cycle_ended - started
        if explain:
            self._explain_took = self.last_cycle_s
        self.rt.metrics.cycle_seconds.observe(self.last_cycle_s)
        return applied

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

    def _without_awaiting(self, snapshot: Snapshot) -> Snapshot:
        """Hide jobs whose preemption victims are still stopping; forget those whose are gone."""
        active = {a.id for a in snapshot.allocations}
        self.awaiting = {j: v for j, v in self.awaiting.items() if v & active}
        if not self.awaiting:
            return snapshot
        queued = tuple(j for j in snapshot.queued if j.id not in self.awaiting)
        return replace(snapshot, queued=queued)

    def _explain_due(self, queued: int, now: float) -> bool:
        """Does this cycle work out why each job it leaves waits? Always on a short queue;
        on a long one at most every ``explain_interval_s``: the cycles between place only
        (the same placements), and the last reasons stand, less the jobs placed since.
        Only a kept scheduler can leave explanations out; any other always explains."""
        interval = self.rt.settings.scheduling.explain_interval_s
        if queued <= EXPLAIN_ALWAYS or interval == 0 or not isinstance(self.schedule, KeptSchedule):
            return True
        return now - self._explained_at >= self.explain_every

    @property
    def explain_every(self) -> float:
        """Seconds between explaining cycles on a long queue: ``explain_interval_s``,
        stretched so that explaining stays under ``EXPLAIN_SHARE`` of the time."""
        interval = self.rt.settings.scheduling.explain_interval_s
        return max(interval, self._explain_took / EXPLAIN_SHARE)

    def _served(self, records: Mapping[str, JobRecord], applied: Applied, now: float) -> None:
        """Record each placed job's user in the service ledger."""
        for assignment in applied.placed:
            for work in assignment.jobs:
                rec = records.get(work.job_id)
                if rec is not None:
                    self.service.record(rec.job.user, now)

    def _remember(
        self, snapshot: Snapshot, plan: Plan, now: float, explained: bool, offered: int
    ) -> None:
        """Keep the cycle's reasons (``GET /v1/queue``) and what the next cycle waits for.
        ``offered``: the queued jobs the cycle was given (not those awaiting victims)."""
        placed = {j for p in plan.placements for j in p.job_ids}
        if explained:
            self.unplaced = {u.job_id: u for u in plan.unplaced}
            self._explained_at = now
            self.rt.metrics.observe_queue(j for j in snapshot.queued if j.id not in placed)
        else:  # the last explained cycle's reasons, less the jobs placed since
            for job_id in placed:
                self.unplaced.pop(job_id, None)
            self.unplaced.update((u.job_id, u) for u in plan.unplaced)
        # The earliest retry back-off still to end (C-level: this runs over the whole queue).
        self._next_timer = min(filter(now.__lt__, map(_NOT_BEFORE, snapshot.queued)), default=None)
        left = offered > len(placed)  # what an explained cycle would leave unplaced
        self.rt.work_waiting = bool(left or self.awaiting or self._next_timer is not None)
        self.rt.metrics.observe_nodes(snapshot.nodes)


def _after(
    follow_up: Callable[[Snapshot, Plan], Awaitable[object]], snapshot: Snapshot, plan: Plan
) -> Callable[[], Awaitable[None]]:
    """``follow_up`` as an action after a submission's commit: its failure is logged, never
    the submission's (which has committed)."""

    async def run() -> None:
        try:
            await follow_up(snapshot, plan)
        except Exception:
            log.exception("after a cycle in a submission")

    return run


class _Savepoint:
    """A savepoint in a write transaction the store runs itself, as one raw statement:
    SQLAlchemy's ``begin_nested`` cost more than the commit ``place_in`` saves."""

    def __init__(self, execute: Callable[[str], Awaitable[object]], pg: bool) -> None:
        self._execute = execute
        self.pg = pg

    @classmethod
    def of(cls, conn: AsyncConnection) -> _Savepoint | None:
        """A savepoint on the driver connection under ``conn``, else None."""
        try:
            name, _ = sql.driver(conn)
        except sql.NotRunByStore:
            return None

        async def run(text: str) -> object:
            await sql.plain(conn, text)
            return None

        return cls(run, pg=name == "postgresql")

    async def take(self) -> None:
        await self._execute("SAVEPOINT corral_place")

    async def undo(self) -> None:
        await self._execute("ROLLBACK TO corral_place")

    async def release(self) -> None:
        """Forget the savepoint. PostgreSQL's commit takes it along: no round trip for it."""
        if not self.pg:
            await self._execute("RELEASE corral_place")


def _hit_cycle_limit(u: Unplaced) -> bool:
    return any(r.code is ReasonCode.CYCLE_LIMIT for r in u.reasons)
