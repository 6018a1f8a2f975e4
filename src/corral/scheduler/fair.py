"""``FairQueue``: the fair order of ``ordering.py`` over a plain list of jobs.

Weighted round robin across users (a virtual clock per user, advanced by ``1 / weight``
per job served), ties to the user with less running work per weight, then the oldest
job, then the id: what a cycle walks to explain the jobs it leaves queued. A pass walks
the same order over the queue's kept groups instead (``ordering.LiveQueue``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from heapq import heapify, heappop, heappush

from corral.core.model import Job
from corral.scheduler.user_groups import job_key


class FairQueue:
    """Weighted round robin across users over one class's jobs (grouped by user and sorted
    by ``job_key`` when made): the order in which a cycle explains what stays queued."""

    def __init__(
        self,
        jobs: Iterable[Job],
        weights: Mapping[str, float],
        running: Mapping[str, float],
    ) -> None:
        per_user: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            per_user[job.user].append(job)
        self._lists = per_user
        self._cursor: dict[str, int] = {}
        self._heap: list[tuple[float, float, float, str, str]] = []
        self._step: dict[str, float] = {}
        for user, own in per_user.items():
            own.sort(key=job_key)
            weight = weights.get(user, 1.0)
            if weight <= 0:
                weight = 1.0
            self._cursor[user] = 0
            self._step[user] = 1.0 / weight
            tie = running.get(user, 0.0) / weight
            job = own[0]
            self._heap.append((0.0, tie, job.submitted_at, job.id, user))
        heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Job]:
        while self._heap:
            yield self.pop()

    def pop(self) -> Job:
        """The next job: the least served user's oldest job."""
        vt, tie, _, _, user = heappop(self._heap)
        own = self._lists[user]
        at = self._cursor[user]
        job = own[at]
        at += 1
        if at < len(own):
            self._cursor[user] = at
            nxt = own[at]
            heappush(self._heap, (vt + self._step[user], tie, nxt.submitted_at, nxt.id, user))
        return job
