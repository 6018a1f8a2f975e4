"""The passes of a cycle, and stopping them early.

    admit       unknown priority class -> unplaced (none); future not_before -> (wait)
    guaranteed  classes by rank; inside a class, fair round robin across users;
                only work that keeps its team within quota (may reclaim by preemption)
    borrowing   what was over quota, classes by rank; inside a class the team that
                borrows least per weight goes next, then fair across its users

Without explanations (``explain=False``: the simulator's mode, and any caller
that only wants placements and preemptions), a pass skips the jobs
``Planner.doomed`` says would be left queued without changing anything, and
stops as soon as that holds for every job still in it: each *group* of alike
jobs left in the pass (``queues.Group``) is checked against the memos, after
as many skips in a row as there are groups. Jobs a stopped guaranteed pass
never reached are deferred to the borrowing pass exactly when the ledger, as
it stood then, says they are over quota. So a cycle costs what changed (jobs
placed, room given back), not the length of the queue; the placements and
preemptions are the same as with explanations (a hypothesis test checks).
Classes with batchable jobs are walked in full (a skipped job could otherwise
join a later batch).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from corral.core.model import EMPTY, Job, PriorityClass
from corral.scheduler.api import ReasonCode, Remedy
from corral.scheduler.explain import simple
from corral.scheduler.ordering import FairQueue, by_rank
from corral.scheduler.planner import CYCLE_LIMIT, Planner, Verdict
from corral.scheduler.queues import Group, Queue

LIVE, DEFER, DEAD = Verdict.LIVE, Verdict.DEFER, Verdict.DEAD


@dataclass(slots=True)
class Stop:
    """Where a guaranteed pass stopped early: who it reached, and the usage then."""

    popped: set[str]
    used: dict[str, int]
    left: Counter[Group]


@dataclass(slots=True)
class Deferred:
    """What a class's guaranteed pass left for its borrowing pass."""

    ids: set[str]
    counts: Counter[Group]
    stop: Stop | None


class Passes:
    """Runs the passes of one cycle over ``queue`` with ``planner``."""

    def __init__(
        self, planner: Planner, queue: Queue, running: Mapping[str, Mapping[str, float]]
    ) -> None:
        self.planner = planner
        self.queue = queue
        self.running = running
        self.now = now = planner.now
        self.weights = planner.config.user_weights
        self.stopped = False  # the cycle limit was reached (without explanations: stop)
        if now >= 0:
            waiting = [j for j in queue.timed.values() if j.not_before > now]
        else:
            waiting = [j for j in queue.jobs.values() if j.not_before > now]
        self.waiting = waiting
        self.keep: Callable[[Job], bool] | None = (
            (lambda job: job.not_before <= now) if waiting else None
        )
        self._deferred: dict[str, Deferred] = {}

    def run(self) -> None:
        if self.planner.explain:
            self._admit()
        ranked = by_rank(self.planner.config.priority_classes)
        for pclass in ranked:
            self._guaranteed(pclass)
            if self.stopped:
                return
        for pclass in ranked:
            self._borrowing(pclass)
            if self.stopped:
                return

    def _admit(self) -> None:
        """Leave, with their reasons, jobs of unknown classes and jobs still backing off."""
        planner, now = self.planner, self.now
        for job in self.queue.jobs.values():
            if job.id in self.queue.unknown:
                text = f"unknown priority class {job.priority!r}"
                planner.leave(job, simple(ReasonCode.UNKNOWN_PRIORITY, text, Remedy.NONE))
            elif job.not_before > now:
                text = f"retry backoff: not before {job.not_before - now:.0f}s from now"
                planner.leave(job, simple(ReasonCode.NOT_BEFORE, text, Remedy.WAIT))

    def _fast(self, cls: str) -> bool:
        return not self.planner.explain and not self.queue.batchable.get(cls)

    def _guaranteed(self, pclass: PriorityClass) -> None:
        cls = pclass.name
        users = self.queue.by_user.get(cls)
        if not users:
            return
        queue = FairQueue.over(users, self.weights, self.running.get(cls, EMPTY), self.keep)
        deferred = self._deferred[cls] = Deferred(set(), Counter(), None)
        planner, groups = self.planner, self.queue.groups
        if not self._fast(cls):
            for job in queue:
                if not planner.consider(job, pclass, guaranteed=True):
                    deferred.ids.add(job.id)
                    deferred.counts[groups[job.id]] += 1
            return
        left = self._ready_counts(cls)
        popped: set[str] = set()
        streak = 0
        for job in queue:
            popped.add(job.id)
            group = groups[job.id]
            left[group] -= 1
            verdict = self._step(job, group, pclass, guaranteed=True)
            if self.stopped:
                return
            if verdict is DEFER:
                deferred.ids.add(job.id)
                deferred.counts[group] += 1
            if verdict is LIVE:
                streak = 0
                continue
            streak += 1
            if streak >= len(left):
                streak = 0
                if self._all_dead(left, pclass, guaranteed=True):
                    used = {g.team: planner.ledger.used(g.team) for g in left}
                    deferred.stop = Stop(popped, used, left)
                    return

    def _borrowing(self, pclass: PriorityClass) -> None:
        cls = pclass.name
        deferred = self._deferred.get(cls)
        if deferred is None:
            return
        counts, stop = deferred.counts, deferred.stop
        ledger = self.planner.ledger
        if stop is not None:
            for group, n in stop.left.items():
                if n > 0 and not self._within_at_stop(stop, group.team, group):
                    counts[group] += n
        teams = sorted({g.team for g, n in counts.items() if n > 0})
        if not teams:
            return
        keep = self._deferred_filter(deferred)
        running = self.running.get(cls, EMPTY)
        queues = {
            t: FairQueue.over(self.queue.by_team[cls][t], self.weights, running, keep)
            for t in teams
        }
        heap = [(ledger.borrowed(t) / ledger.weight(t), t) for t, q in queues.items() if q]
        heapq.heapify(heap)
        fast = self._fast(cls)
        streak = 0
        while heap:
            _, team = heapq.heappop(heap)
            queue = queues[team]
            job = queue.pop()
            if not fast:
                self.planner.consider(job, pclass, guaranteed=False)
            else:
                group = self.queue.groups[job.id]
                counts[group] -= 1
                verdict = self._step(job, group, pclass, guaranteed=False)
                if self.stopped:
                    return
                streak = 0 if verdict is LIVE else streak + 1
                if streak >= len(counts):
                    streak = 0
                    if self._all_dead(counts, pclass, guaranteed=False):
                        return
            if queue:
                heapq.heappush(heap, (ledger.borrowed(team) / ledger.weight(team), team))

    def _step(self, job: Job, group: Group, pclass: PriorityClass, guaranteed: bool) -> Verdict:
        """Decide one job, skipping it when memos say it would be left unchanged."""
        planner = self.planner
        if job.id in planner.decided:
            return DEAD
        if planner.at_limit():
            planner.leave(job, CYCLE_LIMIT)
            self.stopped = True
            return DEAD
        verdict = planner.doomed(group, pclass, guaranteed, job.estimated_runtime_s)
        if verdict is not LIVE:
            return verdict
        if not planner.consider(job, pclass, guaranteed):
            return DEFER
        return LIVE

    def _all_dead(self, left: Counter[Group], pclass: PriorityClass, guaranteed: bool) -> bool:
        """Would every job still in the pass be left queued (or deferred)?"""
        doomed = self.planner.doomed
        return all(
            n <= 0 or doomed(g, pclass, guaranteed, g.floor) is not LIVE for g, n in left.items()
        )

    def _ready_counts(self, cls: str) -> Counter[Group]:
        counts = Counter(self.queue.counts[cls])
        for job in self.waiting:
            if job.priority == cls:
                counts[self.queue.groups[job.id]] -= 1
        return counts

    def _within_at_stop(self, stop: Stop, team: str, group: Group) -> bool:
        lowest = group.need.nominal_milli() * group.replicas
        return stop.used.get(team, 0) + lowest <= self.planner.ledger.quota(team)

    def _deferred_filter(self, deferred: Deferred) -> Callable[[Job], bool]:
        """Jobs the guaranteed pass deferred, counting those a stopped pass never reached."""
        ids, stop, now, groups = deferred.ids, deferred.stop, self.now, self.queue.groups
        if stop is None:
            return lambda job: job.id in ids

        def keep(job: Job) -> bool:
            if job.id in ids:
                return True
            if job.id in stop.popped or job.not_before > now:
                return False
            return not self._within_at_stop(stop, job.team, groups[job.id])

        return keep
