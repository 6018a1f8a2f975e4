"""The passes of a cycle.

    admit       unknown priority class -> unplaced (none); future not_before -> (wait)
    guaranteed  classes by rank; inside a class, fair round robin across users;
                only work that keeps its team within quota (may reclaim by preemption)
    borrowing   what is left, classes by rank; inside a class the team that
                borrows least per weight goes next, then fair across its users;
                up to each team's quota + borrowing limit
    explain     (when asked) every job still queued, with reasons and a remedy

Each pass walks groups of alike jobs, not jobs (``ordering.LiveQueue``): a
group that cannot place anything now (``Planner.live``: over quota, or every
way of placing it already failed since capacity was last given back) is
skipped whole, and a pass ends when no group is live. So a cycle costs what
changed (jobs placed, room given back, a reservation made), not the length of
the queue. A user's turn is used only by a job that is placed: jobs of its
that cannot run now do not push its other jobs back. Explanations, when
asked, are worked out at the end of the cycle, per group and cached, and do
not change the placements: the plan without them has the same placements
and preemptions.

**Small jobs first.** Inside a class (and pass), with ``Config.big_wait_ratio``
set, a pass walks its groups in three steps (``Passes._tiers``): the head of
the line (the oldest big job, ``Config.reservations`` of them) and the big jobs
that are *due*, oldest first (up to ``DUE_HEADS``), each reserving nodes when it
cannot start; then the small jobs (fewer whole GPUs than ``reserve_min_gpus``,
all replicas together); then the rest. A big job is due once it has waited at
least ``big_wait_ratio`` times as long as the oldest small job the pass could
place (any, when none waits). Why: on a saturated cluster, whatever goes to a
big job comes out of the small ones' capacity, and a small job fits wherever
one card frees while a big one needs a whole node drained. Serving small jobs
first keeps the common sizes' waits short; the ratio bounds how much longer a
big job waits than a small one, and the head of the line keeps EASY
backfill's guarantee (it always holds a reservation, so a stream of small jobs
never starves it: waiting for the ratio alone, the small jobs that queue up
behind a draining node make the big job stop being due just before it drains).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from heapq import heapify, heappop, heappush
from typing import Final

from corral.core.model import Job, PriorityClass
from corral.scheduler.api import ReasonCode, Remedy
from corral.scheduler.explain import simple
from corral.scheduler.fair import FairQueue
from corral.scheduler.groups import Group
from corral.scheduler.need import Need
from corral.scheduler.ordering import Gate, LiveQueue, by_rank
from corral.scheduler.planner import Planner
from corral.scheduler.queues import ClassQueue, Queue
from corral.scheduler.quota import Ledger, TeamBudget
from corral.scheduler.served import with_served
from corral.scheduler.slots import RunningCount
from corral.scheduler.user_groups import UserGroups

DUE_HEADS: Final = 16
"""Due big jobs a pass decides first (``Passes._tiers``): each that cannot start reserves a
node or two, whose freed cards only backfill uses, and costs a search; 16 drains that many
nodes at once. The rest of the due ones wait for the next cycle, or take what the small
jobs leave."""


class Passes:
    """Runs the passes of one cycle over ``queue`` with ``planner``."""

    def __init__(
        self,
        planner: Planner,
        queue: Queue,
        running: dict[str, dict[str, RunningCount]],
        served: dict[str, float] | None = None,
    ) -> None:
        self.planner = planner
        self.queue = queue
        self.running = running  # class -> user -> running work
        self.served: dict[str, float] = {} if served is None else served  # user -> service
        self.now = planner.now
        self.weights = dict(planner.config.user_weights)  # a dict: ``LiveQueue`` reads it
        self.ranked = by_rank(planner.config.priority_classes)
        decided, now = planner.decided, self.now
        self.usable: Callable[[Job], bool] = lambda job: (
            job.id not in decided and job.not_before <= now
        )  # what ``Liveness.usable`` says, for the explanations

    def run(self) -> None:
        planner = self.planner
        if planner.explain:
            self._admit()
        for pclass in self.ranked:
            if not planner.stopped:
                self._guaranteed(pclass)
        for pclass in self.ranked:
            if not planner.stopped:
                self._borrowing(pclass)
        if planner.explain:
            self._explain()

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

    def _guaranteed(self, pclass: PriorityClass) -> None:
        """Within-quota work of one class, fair across users."""
        queued = self.queue.classes.get(pclass.name)
        if queued is None or not queued.groups:
            return
        for live in self._tiers(pclass, queued, guaranteed=True):
            self._fair(pclass, queued, live)
            if self.planner.stopped:
                return

    def _fair(self, pclass: PriorityClass, queued: ClassQueue, live: Liveness) -> None:
        """The guaranteed pass's walk over the groups ``live`` admits."""
        groups = queued.groups
        # most passes of a busy cluster end here: cheaper (groups with no job pass over)
        if not any(live.live(g) for g, holders in groups.items() if holders):
            return
        running = self.running.get(pclass.name) or {}
        users = queued.users.values()
        queue = LiveQueue(groups, self.weights, running, live, users, self.served)
        planner = self.planner
        state = planner.state()
        while (job := queue.pop()) is not None:
            group = queue.group()
            placed = planner.decide(job, group, pclass, guaranteed=True)
            if not placed:  # a failure may have left memos; a placement only took room
                live.touched(group)
            queue.done(job, placed, planner.riders if placed else ())
            if planner.stopped:
                return
            if planner.state() != state:
                state = planner.state()
                live.reset()
                queue.refill()

    def _borrowing(self, pclass: PriorityClass) -> None:
        """What is left of one class: the team borrowing least per weight first."""
        queued = self.queue.classes.get(pclass.name)
        if queued is None or not queued.groups:
            return
        for live in self._tiers(pclass, queued, guaranteed=False):
            self._by_share(pclass, queued, live)
            if self.planner.stopped:
                return

    def _by_share(self, pclass: PriorityClass, queued: ClassQueue, live: Liveness) -> None:
        """The borrowing pass's walk over the groups ``live`` admits."""
        groups = queued.groups
        by_team = queued.users
        # A team none of whose jobs may be handed out gets no queue: it would stay empty
        # through every refill (usable jobs only get fewer in a cycle). The common case:
        # the guaranteed pass placed them (96% of these queues were empty at 20,000 jobs).
        teams = sorted(
            t for t, own in by_team.items() if _any_usable(own, live) and _any_live(own, live)
        )
        if not teams:
            return
        running = self.running.get(pclass.name) or {}
        queues = {
            t: LiveQueue(groups, self.weights, running, live, (by_team[t],), self.served)
            for t in teams
        }
        planner, ledger = self.planner, self.planner.ledger
        shares = _shares(queues, ledger)
        state = planner.state()
        while shares:
            _, team = heappop(shares)
            queue = queues[team]
            job = queue.pop()
            if job is None:
                continue
            group = queue.group()
            placed = planner.decide(job, group, pclass, guaranteed=False)
            if not placed:  # a failure may have left memos; a placement only took room
                live.touched(group)
            queue.done(job, placed, planner.riders if placed else ())
            if planner.stopped:
                return
            if planner.state() != state:  # groups may live again: every team's queue
                state = planner.state()
                live.reset()
                for q in queues.values():
                    q.refill()
                shares = _shares(queues, ledger)
            elif queue:
                heappush(shares, (_share(ledger, team), team))

    def _head(
        self, pclass: PriorityClass, guaranteed: bool, due_by: float = -math.inf, due: int = 0
    ) -> None:
        """The oldest big jobs this pass may place go first: ``Config.reservations`` of
        them, then up to ``due`` more submitted at or before ``due_by``; each that cannot
        start reserves nodes (``reservation.py``)."""
        planner = self.planner
        count = planner.config.reservations
        queued = self.queue.classes.get(pclass.name)
        if queued is None or not queued.big or count + due < 1 or planner.stopped:
            return
        ledger, groups = planner.ledger, self.queue.groups
        decided, now = planner.decided, self.now
        blocked: dict[str, float] = {}  # team -> the least milli it was found to lack room for
        teams = len(queued.big_teams)  # teams with big jobs queued
        heads: list[Job] = []
        for job in queued.big:
            if len(heads) >= count and job.submitted_at > due_by:
                break
            if job.id in decided or job.not_before > now:
                continue
            lowest = groups[job.id].lowest
            team = job.team
            if lowest >= blocked.get(team, math.inf):
                continue
            if lowest > ledger.headroom(team, not guaranteed):
                blocked[team] = min(lowest, blocked.get(team, lowest))
                if len(blocked) == teams:
                    break
                continue
            heads.append(job)
            if len(heads) >= count + due:
                break
        for job in heads:
            if planner.stopped:
                return
            planner.head(job, pclass, guaranteed)

    def _tiers(
        self, pclass: PriorityClass, queued: ClassQueue, guaranteed: bool
    ) -> Iterator[Liveness]:
        """The groups of a pass, walk by walk (module docstring, "small jobs first"): with
        ``Config.big_wait_ratio``, the big jobs that are due, then the small jobs, then
        the rest; else every group in one walk."""
        ratio, big = self.planner.config.big_wait_ratio, self.queue.big_gpus
        if ratio is None or big is None or not queued.big:
            self._head(pclass, guaranteed)
            yield self._live(pclass, guaranteed)
            return
        small = self._live(pclass, guaranteed, small_below=big)
        oldest = _oldest_small(queued, small)
        # none waiting: no small job to put first, so every big job is due
        due_by = self.now if oldest == math.inf else self.now - ratio * (self.now - oldest)
        self._head(pclass, guaranteed, due_by, DUE_HEADS)
        small.reset()  # the big jobs took room or made reservations (room to backfill)
        if not self.planner.stopped:
            yield small
        yield self._live(pclass, guaranteed)

    def _live(
        self, pclass: PriorityClass, guaranteed: bool, small_below: int | None = None
    ) -> Liveness:
        by_need = self.queue.classes[pclass.name].by_need
        return Liveness(self.planner, pclass, guaranteed, by_need, small_below)

    def _explain(self) -> None:
        """Every job still queued, with reasons: classes by rank, fair order inside each."""
        planner, usable, waiting = self.planner, self.usable, self.planner.reasons
        for pclass in self.ranked:
            queued = self.queue.classes.get(pclass.name)
            if queued is None:
                continue
            left = [
                job
                for holders in queued.groups.values()
                for jobs in holders.values()
                for job in jobs
                if job.id in waiting or usable(job)  # a wait for a model holder has its reason
            ]
            running = with_served(self.running, self.served, (pclass.name,)).get(pclass.name, {})
            for job in FairQueue(left, self.weights, running):
                planner.leave(job, planner.explanation(job, pclass))


def _shares(queues: dict[str, LiveQueue[Group]], ledger: Ledger) -> list[tuple[float, str]]:
    """A heap of the teams with a job to hand out, by what each borrows per weight."""
    shares = [(_share(ledger, t), t) for t, q in queues.items() if q]
    heapify(shares)
    return shares


def _share(ledger: Ledger, team: str) -> float:
    """What ``team`` borrows per weight: the borrowing pass serves the least first."""
    return ledger.borrowed(team) / ledger.weight(team)


def _oldest_small(queued: ClassQueue, small: Liveness) -> float:
    """When the oldest job of the groups ``small`` admits (small jobs this pass could place)
    was submitted; inf: none. Each user's groups are in order of their oldest job, so a
    user's walk stops at its first admitted group, or at one younger than the oldest found."""
    oldest = math.inf
    for users in queued.users.values():
        for own in users.values():
            for cursor in own.cursors:
                if cursor.first.submitted_at >= oldest:
                    break
                if not small.live(cursor.group):
                    continue
                job = next((j for j in cursor.jobs if small.usable(j)), None)
                if job is not None:
                    oldest = min(oldest, job.submitted_at)
                    break
    return oldest


def _any_usable(users: dict[str, UserGroups[Group]], live: Liveness) -> bool:
    """Does a team (``users``: its users' groups in a class) hold a job that may be handed
    out (not decided yet)?"""
    return any(
        live.usable(job) for own in users.values() for cursor in own.cursors for job in cursor.jobs
    )


def _any_live(users: dict[str, UserGroups[Group]], live: Liveness) -> bool:
    """Is any of a team's groups (``users``: its users' groups in a class) live?"""
    return any(live.live(cursor.group) for own in users.values() for cursor in own.cursors)


class Liveness(Gate[Group]):
    """``Planner.live`` for one pass and class: the quota part asked each time, the memo
    part remembered per group; and whether a job may be handed out (not decided yet,
    ready).

    A decision changes memos of its own need only (a failure), so afterwards only the
    groups of that need are asked again; every group is, after capacity comes back or a
    reservation is made (``reset``), and after a CPU-offload try.
    """

    def __init__(
        self,
        planner: Planner,
        pclass: PriorityClass,
        guaranteed: bool,
        by_need: Mapping[Need, list[Group]],
        small_below: int | None = None,
    ) -> None:
        self._planner = planner
        self._small_below = small_below  # admit only groups of fewer GPUs (all replicas)
        self._decided = planner.decided
        self._now = planner.now
        self._pclass = pclass
        self._guaranteed = guaranteed
        self._asks = planner.asks(pclass, guaranteed)  # by team: one look-up per group asked
        self._by_need = by_need  # the class's groups by need (kept by ``Queue``)
        self._seen: dict[Group, _Seen] = {}  # what was found of each group asked

    def live(self, group: Group) -> bool:
        below = self._small_below
        if below is not None and group.need.gpus * group.replicas >= below:
            return False
        seen = self._seen.get(group)
        if seen is None:
            planner = self._planner
            fits = planner.may_fit(group, self._pclass, self._guaranteed, self._asks)
            budget = planner.ledger.budget(group.team)
            seen = self._seen[group] = _Seen(fits, budget, budget.bound(not self._guaranteed))
        if not seen.fits:
            return False
        bound = seen.bound  # inf: borrowing without a limit
        return bound == math.inf or group.lowest + seen.budget.usage <= bound

    def usable(self, job: Job) -> bool:
        return job.id not in self._decided and job.not_before <= self._now

    def touched(self, group: Group) -> None:
        """A job of ``group`` was just decided."""
        if group.cpu:
            self.reset()
            return
        alike = self._by_need.get(group.need)
        if alike is not None:
            for other in alike:
                self._seen.pop(other, None)

    def reset(self) -> None:
        self._seen.clear()


class _Seen:
    """What a ``Liveness`` found of a group since the last reset: may a job of it fit
    (``fits``, from the planner's memos), its team's ``budget`` and the most the team may
    hold in this pass (``bound``)."""

    __slots__ = ("bound", "budget", "fits")

    def __init__(self, fits: bool, budget: TeamBudget, bound: float) -> None:
        self.fits = fits
        self.budget = budget
        self.bound = bound
