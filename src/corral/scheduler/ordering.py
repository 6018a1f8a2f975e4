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
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping

from corral.core.model import Job, PriorityClass


def job_key(job: Job) -> tuple[float, str]:
    """A user's own jobs run oldest first (FIFO), ids breaking ties."""
    return (job.submitted_at, job.id)


def by_rank(classes: Iterable[PriorityClass]) -> list[PriorityClass]:
    """Classes from most to least urgent (higher rank first, then name)."""
    return sorted(classes, key=lambda c: (-c.rank, c.name))


class FairQueue:
    """Weighted round robin across users over one class's jobs."""

    def __init__(
        self,
        jobs: Iterable[Job],
        weights: Mapping[str, float],
        running: Mapping[str, float],
    ) -> None:
        per_user: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            per_user[job.user].append(job)
        self._queues: dict[str, deque[Job]] = {}
        self._heap: list[tuple[float, float, float, str, str]] = []
        self._step: dict[str, float] = {}
        for user, own in per_user.items():
            own.sort(key=job_key)
            weight = weights.get(user, 1.0)
            if weight <= 0:
                weight = 1.0
            self._queues[user] = deque(own)
            self._step[user] = 1.0 / weight
            tie = running.get(user, 0.0) / weight
            heapq.heappush(self._heap, (0.0, tie, own[0].submitted_at, own[0].id, user))

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Job]:
        while self._heap:
            yield self.pop()

    def pop(self) -> Job:
        """The next job: the least served user's oldest job."""
        vt, tie, _, _, user = heapq.heappop(self._heap)
        queue = self._queues[user]
        job = queue.popleft()
        if queue:
            nxt = queue[0]
            entry = (vt + self._step[user], tie, nxt.submitted_at, nxt.id, user)
            heapq.heappush(self._heap, entry)
        return job
