"""The fair queue of a pass as it was before ``Queue`` kept each user's lines (sim2 round):
a reference model the kept version must agree with, pop for pop (test_sched_ordering)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from corral.core.model import Job

Q = TypeVar("Q")


class ReferenceLiveQueue(Generic[Q]):
    """Weighted round robin across users, over the jobs of groups that are still live.

    ``groups`` maps each group to its jobs by user (each user's sorted by
    ``job_key``). Only groups ``live`` says may still be placed are walked,
    and only their users are looked at; a user's next job is its oldest job in
    such a group (``usable`` rejects jobs already decided or not ready). A
    group found dead is skipped whole, never job by job. A user's turn is used
    only when ``done`` says the job was placed: a job that stays queued costs
    its user nothing. Each job is handed out at most once; after a change that
    may revive groups (capacity given back), ``refill``. The lists must not
    change while the queue is in use.

    The containers are concrete (``dict``, ``list``) and a slot is a small class, so a
    compiled build indexes them directly: a pass builds one of these per class (and per
    team when borrowing), about 20 a cycle, and building them is a tenth of a long run.
    """

    def __init__(
        self,
        groups: dict[Q, dict[str, list[Job]]],
        weights: Mapping[str, float],
        running: Mapping[str, float],
        live: Callable[[Q], bool],
        usable: Callable[[Job], bool],
        only: Callable[[Q], bool] | None = None,
    ) -> None:
        self._groups = groups
        self._candidates = [g for g in groups if only is None or only(g)]
        self._weights = weights
        self._running = running
        self._live = live
        self._usable = usable
        self._slots: dict[Q, dict[str, _Slot[Q]]] = {}  # group -> user -> its slot
        self._made = 0  # slots made so far: the next one's seq
        self._vt: dict[str, float] = {}
        self._step: dict[str, float] = {}
        self._tie: dict[str, float] = {}
        # per user: a heap of its live slots by their next job's key
        self._mine: dict[str, list[tuple[float, str, int, _Slot[Q]]]] = {}
        self._heap: list[tuple[float, float, float, str, str, _Slot[Q]]] = []
        self._popped: _Slot[Q] | None = None
        self.refill()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def refill(self) -> None:
        """Find every user's next job again (groups may have come back to life)."""
        mine: dict[str, list[tuple[float, str, int, _Slot[Q]]]] = {}
        slots, live, usable, groups = self._slots, self._live, self._usable, self._groups
        for group in self._candidates:
            if not live(group):
                continue
            own_slots = slots.get(group)
            if own_slots is None:
                own_slots = slots[group] = {}
            for user, jobs in groups[group].items():
                slot = own_slots.get(user)
                if slot is None:
                    slot = own_slots[user] = _Slot(group, jobs, self._made)
                    self._made += 1
                at, end = slot.at, len(jobs)
                while at < end and not usable(jobs[at]):
                    at += 1
                slot.at = at
                if at < end:
                    job = jobs[at]
                    own = mine.get(user)
                    if own is None:
                        own = mine[user] = []
                    own.append((job.submitted_at, job.id, slot.seq, slot))
        heap = []
        vt = self._vt
        for user, own in mine.items():
            heapq.heapify(own)
            if user not in vt:
                self._start(user)
            entry = self._entry_of(user, own)
            if entry is not None:
                heap.append(entry)
        self._mine = mine
        heapq.heapify(heap)
        self._heap = heap

    def _start(self, user: str) -> None:
        weight = self._weights.get(user, 1.0)
        if weight <= 0:
            weight = 1.0
        self._vt[user] = 0.0
        self._step[user] = 1.0 / weight
        self._tie[user] = self._running.get(user, 0.0) / weight

    def pop(self) -> Job | None:
        """The next job: the least served user's oldest live job (None: no live job left)."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            user, slot = entry[4], entry[5]
            if entry[0] == self._vt[user] and self._live(slot.group):
                at, jobs = slot.at, slot.jobs
                job: Job | None = jobs[at] if at < len(jobs) else None
                if job is not None and job.id == entry[3] and self._usable(job):
                    self._popped = slot
                    return job
            again = self._entry(user)  # its group died, or its turn was used: look again
            if again is not None:
                heapq.heappush(heap, again)
        return None

    def done(self, job: Job, placed: bool, riders: Iterable[Job] = ()) -> None:
        """``job`` (the last ``pop``) was decided; ``placed`` uses its user's turn, and each
        job that joined its allocation (a batch) uses its own user's."""
        slot = self._popped
        if slot is None:
            raise RuntimeError("done() without pop()")
        self._popped = None
        slot.at += 1
        user = job.user
        if placed:
            self._vt[user] += self._step[user]
        for rider in riders:
            if rider.user in self._vt:
                self._vt[rider.user] += self._step[rider.user]
        entry = self._entry(user)
        if entry is not None:
            heapq.heappush(self._heap, entry)

    def _entry(self, user: str) -> tuple[float, float, float, str, str, _Slot[Q]] | None:
        own = self._mine.get(user)
        return None if own is None else self._entry_of(user, own)

    def _entry_of(
        self, user: str, own: list[tuple[float, str, int, _Slot[Q]]]
    ) -> tuple[float, float, float, str, str, _Slot[Q]] | None:
        """The heap entry of ``user``'s next live, usable job.

        ``own`` holds the user's slots by the key of their next job. A group only dies
        between refills, so a dead slot leaves for good; a slot whose next job moved
        on (decided, or handed out) goes back with its new key.
        """
        usable, live = self._usable, self._live
        while own:
            sub, job_id, seq, slot = own[0]
            if not live(slot.group):
                heapq.heappop(own)
                continue
            jobs, at = slot.jobs, slot.at
            end = len(jobs)
            while at < end and not usable(jobs[at]):
                at += 1
            slot.at = at
            if at >= end:
                heapq.heappop(own)
                continue
            job = jobs[at]
            if job.id != job_id:
                heapq.heapreplace(own, (job.submitted_at, job.id, seq, slot))
                continue
            return (self._vt[user], self._tie[user], sub, job_id, user, slot)
        return None


class _Slot(Generic[Q]):
    """One user's jobs in one group, with a cursor at its next job not yet handed out;
    ``seq`` (order of making) breaks ties between a user's slots."""

    __slots__ = ("at", "group", "jobs", "seq")

    def __init__(self, group: Q, jobs: list[Job], seq: int) -> None:
        self.group = group
        self.jobs = jobs
        self.at = 0
        self.seq = seq
