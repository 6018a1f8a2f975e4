"""The order in which queued work is considered.

Across priority classes: higher ``rank`` first. Inside a class: fair mixing
across users by weighted round robin (a virtual clock per user that advances
by ``1 / weight`` per job served; least served first). So one user's 10,000
jobs cannot delay another user's single job by more than one round: with
equal weights, every user's next job comes before anyone's second one.

Ties inside a round go to the user with less work already running in the
class (per weight), then to the user whose oldest job is oldest, then by
name: deterministic, and it carries fairness from cycle to cycle.

``LiveQueue`` is that order over the queue's kept groups, as a pass walks them;
``fair.FairQueue`` the same order over a plain list of jobs (a cycle's explanations).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable
from heapq import heapify, heappop, heappush, heapreplace
from typing import Final, Generic, TypeVar

from corral.core.model import Job, PriorityClass
from corral.scheduler.slots import RunningCount
from corral.scheduler.user_groups import GroupCursor, UserGroups, job_before, user_groups_of

Q = TypeVar("Q", bound=Hashable)


def by_rank(classes: Iterable[PriorityClass]) -> list[PriorityClass]:
    """Classes from most to least urgent (higher rank first, then name)."""
    return sorted(classes, key=lambda c: (-c.rank, c.name))


class Gate(Generic[Q]):
    """What a ``LiveQueue`` asks as it walks: may a group still be placed now (``live``),
    may a job be handed out (``usable``: not decided, ready)."""

    def live(self, group: Q) -> bool:
        raise NotImplementedError

    def usable(self, job: Job) -> bool:
        raise NotImplementedError


class Checks(Gate[Q]):
    """A gate that asks two functions."""

    def __init__(self, live: Callable[[Q], bool], usable: Callable[[Job], bool]) -> None:
        self._live = live
        self._usable = usable

    def live(self, group: Q) -> bool:
        return self._live(group)

    def usable(self, job: Job) -> bool:
        return self._usable(job)


class LiveQueue(Generic[Q]):
    """Weighted round robin across users, over the jobs of groups that are still live.

    ``groups`` maps each group to its jobs by user (each user's sorted by ``job_key``);
    ``user_groups`` gives, per team, each user's groups in the order of its oldest job in
    each (made from ``groups`` when not given). Only groups ``gate.live`` says may still be
    placed are looked at; a user's next job is its oldest job in such a group
    (``gate.usable`` rejects jobs already decided or not ready). A group found dead is
    skipped whole, never job by job. A user's turn is used only when ``done`` says the job
    was placed: a job that stays queued costs its user nothing. Each job is handed out at
    most once; after a change that may revive groups (capacity given back), ``refill``.
    The lists must not change while the queue is in use.

    A user's next job is the sooner of two: the first live group of each of its
    ``UserGroups`` whose next job is still its first (a group's oldest job never comes
    before those of the groups after it), and the top of a heap of the groups whose cursor
    moved on (handed out or skipped jobs), keyed by their next job. So a pass looks at the
    front of each user's groups, not at every live group.

    Ties between users: their running work in the class (``running``) plus their recent
    service in every class (``served``, ``served.py``), per weight.
    """

    def __init__(
        self,
        groups: dict[Q, dict[str, list[Job]]],
        weights: dict[str, float],
        running: dict[str, RunningCount],
        gate: Gate[Q],
        user_groups: Iterable[dict[str, UserGroups[Q]]] | None = None,
        served: dict[str, float] | None = None,
    ) -> None:
        self._weights = weights
        self._running = running
        self._served: dict[str, float] = {} if served is None else served
        self._gate = gate
        epoch = next(_EPOCHS)
        users: dict[str, _User[Q]] = {}
        by_team = (user_groups_of(groups),) if user_groups is None else user_groups
        for per_user in by_team:
            for user, own in per_user.items():
                if not own.cursors:  # kept empty by ``Queue`` for the user's next job
                    continue
                state = users.get(user)
                if state is None:
                    users[user] = _User(user, own, epoch)
                else:
                    state.lines.append(own)
        self._users = users
        self._made = 0  # cursors taken up so far: the next one's seq
        self._heap: list[_User[Q]] = []  # users with a next job, by its key (``_User.__lt__``)
        self._popped: GroupCursor | None = None
        self._popped_by: _User[Q] | None = None
        self.refill()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def refill(self) -> None:
        """Find every user's next job again (groups may have come back to life)."""
        heap = []
        for state in self._users.values():
            state.pos = [0] * len(state.lines)
            state.moved = None
            if self._entry(state):
                heap.append(state)
        heapify(heap)
        self._heap = heap

    def _start(self, state: _User[Q]) -> None:
        user = state.name
        weight = self._weights.get(user, 1.0)
        if weight <= 0:
            weight = 1.0
        state.started = True
        state.vt = 0.0
        state.step = 1.0 / weight
        count = self._running.get(user)
        running = 0.0 if count is None else count.count
        state.tie = (running + self._served.get(user, 0.0)) / weight

    def pop(self) -> Job | None:
        """The next job: the least served user's oldest live job (None: no live job left)."""
        heap, gate = self._heap, self._gate
        while heap:
            state = heappop(heap)
            cursor = state.cursor
            if state.queued_vt == state.vt and gate.live(cursor.group):
                at, jobs = cursor.at, cursor.jobs
                job: Job | None = jobs[at] if at < len(jobs) else None
                if job is not None and job.id == state.job_id and gate.usable(job):
                    self._popped, self._popped_by = cursor, state
                    return job
            if self._entry(state):  # its group died, or its turn was used: look again
                heappush(heap, state)
        return None

    def group(self) -> Q:
        """The group of the job the last ``pop`` handed out."""
        cursor = self._popped
        if cursor is None:
            raise RuntimeError("group() without pop()")
        group: Q = cursor.group
        return group

    def done(self, job: Job, placed: bool, riders: tuple[Job, ...] = ()) -> None:
        """``job`` (the last ``pop``) was decided; ``placed`` uses its user's turn, and each
        job that joined its allocation (a batch) uses its own user's."""
        cursor, state = self._popped, self._popped_by
        if cursor is None or state is None:
            raise RuntimeError("done() without pop()")
        self._popped, self._popped_by = None, None
        cursor.at += 1
        if placed:
            state.vt += state.step
        for rider in riders:
            other = self._users.get(rider.user)
            if other is not None and other.started:
                other.vt += other.step
        if self._entry(state):
            heappush(self._heap, state)

    def _entry(self, state: _User[Q]) -> bool:
        """Note a user's next live, usable job as its key in the heap (False: it has none).
        The user is not in the heap: it holds each user once at most."""
        best: GroupCursor | None = None
        for i, own in enumerate(state.lines):
            cursor = self._walk(state, own, i)
            if cursor is not None and (best is None or _sooner(cursor, best)):
                best = cursor
        moved = None if state.moved is None else self._moved_on(state.moved)
        if moved is not None and (best is None or _sooner(moved, best)):
            best = moved
        if best is None:
            return False
        if not state.started:
            self._start(state)
        job = best.jobs[best.at]
        state.queued_vt, state.cursor = state.vt, best
        state.at, state.job_id = job.submitted_at, job.id
        return True

    def _walk(self, state: _User[Q], own: UserGroups[Q], i: int) -> GroupCursor | None:
        """The first live cursor of ``own``, the ``i``-th of a user's groups, from
        ``state.pos[i]`` on, whose next job is still its first; cursors passed on the way
        leave the walk for this refill: dead or spent ones for good, moved-on ones into
        ``state.moved``."""
        cursors, gate, pos = own.cursors, self._gate, state.pos
        at_line = pos[i]
        found: GroupCursor | None = None
        while at_line < len(cursors):
            cursor = cursors[at_line]
            if not gate.live(cursor.group):
                at_line += 1
                continue
            self._take_up(cursor, state)
            at = self._skip_unusable(cursor)
            if at >= len(cursor.jobs):
                at_line += 1
                continue
            if at > 0:  # moved on: its place among the user's groups no longer says when
                job = cursor.jobs[at]
                if state.moved is None:
                    state.moved = []
                heappush(state.moved, (job.submitted_at, job.id, cursor.seq, cursor))
                at_line += 1
                continue
            found = cursor
            break
        pos[i] = at_line
        return found

    def _skip_unusable(self, cursor: GroupCursor) -> int:
        """Move ``cursor`` past the jobs ``usable`` rejects; where it now stands."""
        jobs, at, gate = cursor.jobs, cursor.at, self._gate
        while at < len(jobs) and not gate.usable(jobs[at]):
            at += 1
        cursor.at = at
        return at

    def _take_up(self, cursor: GroupCursor, state: _User[Q]) -> None:
        """Make ``cursor`` this queue's: one an earlier queue left (another epoch), or
        none yet, starts afresh."""
        if cursor.epoch != state.epoch:
            cursor.at = 0
            cursor.seq = self._made
            cursor.epoch = state.epoch
            self._made += 1

    def _moved_on(self, moved: list[tuple[float, str, int, GroupCursor]]) -> GroupCursor | None:
        """The cursor of the soonest next job among the moved-on ones.

        A group only dies between refills, so a dead cursor leaves for good; one whose
        next job moved on again goes back with its new key.
        """
        gate = self._gate
        while moved:
            _, job_id, seq, cursor = moved[0]
            if not gate.live(cursor.group):
                heappop(moved)
                continue
            at = self._skip_unusable(cursor)
            if at >= len(cursor.jobs):
                heappop(moved)
                continue
            job = cursor.jobs[at]
            if job.id != job_id:
                heapreplace(moved, (job.submitted_at, job.id, seq, cursor))
                continue
            return cursor
        return None


def _sooner(a: GroupCursor, b: GroupCursor) -> bool:
    """Is ``a``'s next job before ``b``'s (``job_key``)?"""
    return job_before(a.jobs[a.at], b.jobs[b.at])


class _User(Generic[Q]):
    """One user's state in a ``LiveQueue``: its groups (``lines``, one ``UserGroups`` per
    team), how far each was walked (``pos``), a heap of its cursors that moved on, by their
    next job's key (``moved``), its virtual clock (``vt``, advanced by ``step`` per turn
    used; ``tie`` breaks ties), set when it first has a job to hand out (``started``), and
    the mark of the cursors it took up (``epoch``).

    It is its own entry in the queue's heap (each user once at most): its next job
    (``cursor``'s) comes by (``queued_vt``, its clock when it went in, ``tie``, the job's
    ``at`` and ``job_id``). A batch's riders move a waiting user's clock: its entry is then
    stale, looked at again when it comes out. Job ids are unique: no two entries tie.
    """

    __slots__ = (
        "at",
        "cursor",
        "epoch",
        "job_id",
        "lines",
        "moved",
        "name",
        "pos",
        "queued_vt",
        "started",
        "step",
        "tie",
        "vt",
    )

    cursor: GroupCursor  # set by ``_entry`` before the user goes in the heap

    def __init__(self, name: str, own: UserGroups[Q], epoch: int) -> None:
        self.name = name
        self.lines = [own]
        self.pos = [0]
        self.epoch = epoch
        self.moved: list[tuple[float, str, int, GroupCursor]] | None = None
        self.started = False
        self.vt = 0.0
        self.step = 1.0
        self.tie = 0.0
        self.queued_vt = 0.0
        self.at = 0.0
        self.job_id = ""

    def __lt__(self, other: _User[Q]) -> bool:
        """By (``queued_vt``, ``tie``, ``at``, ``job_id``), compared field by field: the
        heap compares users on every turn, and a pair of tuples made per comparison cost
        about 5% of the compiled simulator."""
        if self.queued_vt != other.queued_vt:
            return self.queued_vt < other.queued_vt
        if self.tie != other.tie:
            return self.tie < other.tie
        if self.at != other.at:
            return self.at < other.at
        return self.job_id < other.job_id


_EPOCHS: Final = itertools.count(1)  # each queue's mark on the cursors it takes up
