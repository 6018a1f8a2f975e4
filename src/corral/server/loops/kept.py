"""The scheduling leader's kept scheduler, told what changed in the store.

A ``Scheduler`` (scheduler/incremental.py) keeps its working state between
cycles and is told each change: ``submit``, ``withdraw``, ``start``, ``end``.
The simulator tells it from its clock; here ``catch_up`` tells it from the
store's changes (``changes.py``) before each cycle, and ``placed`` tells it
of the allocations a cycle inserted itself. Its plans are those of
``schedule(snapshot, ...)`` on the store's state (``snapshot()`` gives that
state back, for tests and follow-ups that want it whole).

A job whose placement preempts others waits, queued, until its victims have
ended (``services/placement.py``); meanwhile it is set aside, out of the
scheduler's queue, so that the same room is not bought twice, and submitted
again once none of its victims is active. Its scheduler sees the stop window as
the plan meant it (``scheduler/stopping.py``): the victims gone, the job's claim
on the cards it was given, and the victims' other cards held until they end.

A held job (``PATCH /v1/jobs/{id}`` with ``hold``) is never given to the scheduler: it
stays queued in the store and is submitted when a release changes its row. A job moved
to the top of its user's queue is given with its place (``queue_at``) as its submission
time, which is what orders a user's own jobs.
A user's cap on running GPUs (the policy's ``users.<name>.max_running_gpus``)
is kept the same way: before each cycle the user's queued jobs, highest class
and oldest first, are offered to the scheduler only while what the user holds
plus what they ask stays within the cap; the rest are set aside until the
user's work ends. Counting what offered jobs ask, placed or not, never lets
one cycle pass the cap; a job may wait behind another of its user's that
does not fit yet. Only users with a cap cost anything: their queued jobs and
the active allocations are walked each cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Allocation, Job
from corral.core.resources import MILLI
from corral.scheduler.api import Config, Placement, Snapshot
from corral.scheduler.incremental import Scheduler
from corral.scheduler.stopping import stop_window
from corral.server.loops.changes import ChangeFeed, Changes
from corral.server.policy_doc import Policy
from corral.server.store.records import AllocRecord, JobRecord


class Kept:
    """A scheduler kept in step with the store, and the jobs set aside from it."""

    def __init__(self, config: Config, policy: Policy | None = None) -> None:
        self.config = config
        self.policy = policy  # its caps on teams' running GPUs shape the teams told
        self.scheduler = Scheduler(config=config)
        self.feed = ChangeFeed()
        self.awaiting: dict[str, frozenset[str]] = {}  # job -> victims still stopping
        self._aside: dict[str, Job] = {}  # those jobs, out of the scheduler's queue
        # The stop window as the scheduler holds it: each waiting job's claims (allocation
        # ids), and the victims out of its view -> their leftover's id ("" for none)
        self._claims: dict[str, list[str]] = {}
        self._stopping: dict[str, str] = {}
        self.held: set[str] = set()  # held jobs: queued in the store, kept from the scheduler
        users = policy.users if policy is not None else {}
        self.user_caps = {  # milli-GPUs each capped user may hold
            name: round(c.max_running_gpus * MILLI)
            for name, c in users.items()
            if c.max_running_gpus is not None
        }
        self.capped: dict[str, Job] = {}  # jobs of users at their cap, out of the queue

    @property
    def records(self) -> dict[str, JobRecord]:
        """Every queued job's record, at the version told (set-aside ones too): what the
        placement transaction guards its writes with."""
        return self.feed.jobs

    @property
    def queued(self) -> int:
        """Jobs the next cycle considers (not those set aside)."""
        return len(self.scheduler.queue)

    async def catch_up(self, conn: AsyncConnection, model_sizes: Mapping[str, int]) -> None:
        """Tell the scheduler what changed in the store since the last time."""
        self.tell(await self.feed.read(conn))
        if model_sizes != self.scheduler.model_sizes:
            self.scheduler.set_model_sizes(model_sizes)
        self._release()
        if self.user_caps:
            self._cap_users()

    def tell(self, changes: Changes) -> None:
        """``changes`` as the scheduler's events: what went first, then what came."""
        sched, aside = self.scheduler, self._aside
        held = self.held
        for job_id in changes.withdrawn:
            self._withdraw(job_id)
        stopping = self._stopping
        for alloc_id in changes.ended:
            if alloc_id not in stopping:  # a victim's end is seen by ``_release``
                sched.end(alloc_id)
        if changes.nodes is not None:
            sched.set_nodes(changes.nodes)
        teams = changes.teams if self.policy is None else self.policy.capped(changes.teams)
        if teams != sched.teams:
            sched.set_teams(teams)
        for rec in changes.submitted:
            if rec.held:
                held.add(rec.job.id)
                continue
            job = rec.job if rec.queue_at is None else replace(rec.job, submitted_at=rec.queue_at)
            if job.id in self.awaiting:  # still waiting for its victims
                aside[job.id] = job
            else:
                sched.submit(job)
        for job_id in [j for j in self._claims if j not in aside]:
            self._unclaim(job_id)  # cancelled while it waited
        for alloc in changes.started:
            if alloc.alloc.id not in stopping:  # a victim changed as it stops: still out
                sched.start(alloc.alloc, alloc.expected_end_at)

    def _withdraw(self, job_id: str) -> None:
        """``job_id`` left the queue: held, set aside (with its claims), capped or queued."""
        if job_id in self.held:
            self.held.discard(job_id)
        elif self._aside.pop(job_id, None) is not None:
            pass  # its claims go with it unless it comes back changed (``tell``)
        elif self.capped.pop(job_id, None) is None:
            self.scheduler.withdraw(job_id)

    def placed(self, records: Sequence[AllocRecord]) -> None:
        """Allocations a cycle inserted (committed): started now, not read back."""
        self.feed.placed(records)
        for rec in records:
            self.scheduler.start(rec.alloc, rec.expected_end_at)

    def set_aside(
        self,
        awaiting: Mapping[str, frozenset[str]],
        placements: Sequence[Placement] = (),
        now: float = 0.0,
    ) -> None:
        """Jobs waiting for their victims to end leave the scheduler's queue meanwhile, and
        it sees their stop window (``placements``: the plan's, those of waiting jobs used)."""
        queue = self.scheduler.queue.jobs
        for job_id, victims in awaiting.items():
            self.awaiting[job_id] = victims
            if job_id in queue:
                job = self._aside[job_id] = self.scheduler.withdraw(job_id)
                mine = [p for p in placements if p.job_ids[0] == job_id and p.preempts]
                if mine:  # a batch's lead holds it (its riders wait with it)
                    self._claim(job, mine, victims, now)

    def _claim(
        self, job: Job, placements: list[Placement], victims: frozenset[str], now: float
    ) -> None:
        """Hold ``job``'s stop window in the scheduler (``scheduler/stopping.py``)."""
        sched, active = self.scheduler, self.feed.allocations
        held: dict[str, Allocation] = {}
        for victim in sorted(victims):
            rec = active.get(victim)
            if rec is None or victim in self._stopping:
                continue  # ended already, or out of the view for another job
            held[victim] = rec.alloc
        claims, leftovers = stop_window(job, placements, held, now)
        for victim in held:
            sched.end(victim)
            leftover = leftovers.get(victim)
            self._stopping[victim] = "" if leftover is None else leftover.id
            if leftover is not None:
                sched.start(leftover)
        for claim in claims:
            sched.start(claim)
        self._claims[job.id] = [c.id for c in claims]

    def _unclaim(self, job_id: str) -> None:
        """``job_id`` no longer waits: its claims leave the scheduler."""
        for claim in self._claims.pop(job_id, ()):
            self.scheduler.end(claim)

    def _release(self) -> None:
        """Submit again the jobs none of whose victims is still active."""
        if not self.awaiting:
            return
        active = self.feed.allocations
        for victim in [v for v in self._stopping if v not in active]:
            leftover = self._stopping.pop(victim)
            if leftover:
                self.scheduler.end(leftover)
        done = [j for j, victims in self.awaiting.items() if not any(v in active for v in victims)]
        for job_id in done:
            del self.awaiting[job_id]
            self._unclaim(job_id)
            job = self._aside.pop(job_id, None)
            if job is not None:
                self.scheduler.submit(job)

    def _cap_users(self) -> None:
        """Offer each capped user's queued jobs while they fit the cap; set the rest aside."""
        caps = self.user_caps
        held = dict.fromkeys(caps, 0)
        for rec in self.feed.allocations.values():
            alloc = rec.alloc
            if alloc.user in held and not alloc.on_cpu:
                held[alloc.user] += alloc.milli
        queue = self.scheduler.queue.jobs
        rank = {c.name: c.rank for c in self.config.priority_classes}
        theirs = [j for j in (*queue.values(), *self.capped.values()) if j.user in caps]
        theirs.sort(key=lambda j: (-rank.get(j.priority, 0), j.submitted_at, j.id))
        for job in theirs:
            need = job.resources.nominal_milli() * job.replicas
            if held[job.user] + need <= caps[job.user]:
                held[job.user] += need
                if job.id in self.capped:
                    self.scheduler.submit(self.capped.pop(job.id))
            elif job.id in queue:
                self.capped[job.id] = self.scheduler.withdraw(job.id)

    def snapshot(self) -> Snapshot:
        """What the scheduler holds, as the ``Snapshot`` ``schedule`` would be given."""
        return self.scheduler.snapshot()
