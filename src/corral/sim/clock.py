"""The simulator's virtual clock: time jumps from one timer to the next.

Nothing sleeps. The world sets a timer when a job will finish; the runner
asks for the earliest timer, jumps there and handles everything due at that
instant together. A timer carries a token so that one made stale by a
preemption is ignored when it fires (lazy deletion: cheaper than removing
it from the heap).
"""

from __future__ import annotations

import heapq
import itertools


class EventClock:
    """Virtual time and a heap of ``(when, seq, job_id, token)`` timers."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()

    def set_timer(self, when: float, job_id: str, token: int) -> None:
        """Fire ``(job_id, token)`` at ``when`` (never earlier than now)."""
        heapq.heappush(self._timers, (max(when, self.now), next(self._seq), job_id, token))

    def next_time(self) -> float | None:
        """When the earliest timer fires, or None when none is set."""
        return self._timers[0][0] if self._timers else None

    def advance_to(self, when: float) -> None:
        if when < self.now:
            raise ValueError(f"a clock cannot go backwards ({when} < {self.now})")
        self.now = when

    def pop_due(self) -> list[tuple[str, int]]:
        """Remove and return the timers due now, in the order they were set."""
        due: list[tuple[str, int]] = []
        timers, now = self._timers, self.now
        while timers and timers[0][0] <= now:
            _, _, job_id, token = heapq.heappop(timers)
            due.append((job_id, token))
        return due

    def __len__(self) -> int:
        return len(self._timers)
