"""The order in which queued work is considered.

Across priority classes: higher ``rank`` first. Inside a class: fair mixing
across users by weighted round robin (a virtual clock per user that advances
by ``1 / weight`` per job served; least served first). So one user's 10,000
jobs cannot delay another user's single job by more than one round: with
equal weights, every user's next job comes before anyone's second one.

Ties inside a round go to the user with less work already running in the
class (per weight), then to the user whose oldest job is oldest, then by
name: deterministic, and it carries fairness from cycle to cycle.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from corral.core.model import Job, PriorityClass


def job_key(job: Job) -> tuple[float, str]:
    """A user's own jobs run oldest first (FIFO), ids breaking ties."""
    return (job.submitted_at, job.id)


def by_rank(classes: Iterable[PriorityClass]) -> list[PriorityClass]:
    """Classes from most to least urgent (higher rank first, then name)."""
    return sorted(classes, key=lambda c: (-c.rank, c.name))


class FairQueue:
    """Weighted round robin across users over one class's jobs.

    ``FairQueue(jobs, ...)`` groups and sorts; ``FairQueue.over(per_user, ...)``
    walks lists already sorted by ``job_key`` (kept between cycles by
    ``Scheduler``) without copying them, skipping jobs ``keep`` rejects as if
    they were not there.
    """

    def __init__(
        self,
        jobs: Iterable[Job],
        weights: Mapping[str, float],
        running: Mapping[str, float],
    ) -> None:
        per_user: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            per_user[job.user].append(job)
        for own in per_user.values():
            own.sort(key=job_key)
        self._start(per_user, weights, running, None)

    @classmethod
    def over(
        cls,
        per_user: Mapping[str, Sequence[Job]],
        weights: Mapping[str, float],
        running: Mapping[str, float],
        keep: Callable[[Job], bool] | None = None,
    ) -> FairQueue:
        """A queue over per-user lists sorted by ``job_key`` (not copied, not changed)."""
        queue = cls.__new__(cls)
        queue._start(per_user, weights, running, keep)
        return queue

    def _start(
        self,
        per_user: Mapping[str, Sequence[Job]],
        weights: Mapping[str, float],
        running: Mapping[str, float],
        keep: Callable[[Job], bool] | None,
    ) -> None:
        self._lists = per_user
        self._keep = keep
        self._cursor: dict[str, int] = {}
        self._heap: list[tuple[float, float, float, str, str]] = []
        self._step: dict[str, float] = {}
        for user, own in per_user.items():
            first = self._next(own, 0)
            if first >= len(own):
                continue
            weight = weights.get(user, 1.0)
            if weight <= 0:
                weight = 1.0
            self._cursor[user] = first
            self._step[user] = 1.0 / weight
            tie = running.get(user, 0.0) / weight
            job = own[first]
            self._heap.append((0.0, tie, job.submitted_at, job.id, user))
        heapq.heapify(self._heap)

    def _next(self, own: Sequence[Job], at: int) -> int:
        """The first position at or after ``at`` holding a kept job (``len`` when none)."""
        keep = self._keep
        if keep is not None:
            while at < len(own) and not keep(own[at]):
                at += 1
        return at

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Job]:
        while self._heap:
            yield self.pop()

    def pop(self) -> Job:
        """The next job: the least served user's oldest job."""
        vt, tie, _, _, user = heapq.heappop(self._heap)
        own = self._lists[user]
        at = self._cursor[user]
        job = own[at]
        at = at + 1 if self._keep is None else self._next(own, at + 1)
        if at < len(own):
            self._cursor[user] = at
            nxt = own[at]
            heapq.heappush(self._heap, (vt + self._step[user], tie, nxt.submitted_at, nxt.id, user))
        return job
