"""The simulator's virtual clock: time jumps from one timer to the next.

Nothing sleeps. The world sets a timer when a job will finish; the runner
asks for the earliest timer, jumps there and handles everything due at that
instant together. A timer carries a token so that one made stale by a
preemption is ignored when it fires (lazy deletion: cheaper than removing
it from the heap).

Timers fire in the order ``(instant, order set)``. Each is one ``Timer``
record in a heap (``corral.scheduler.heap``: ``heapq``'s algorithm written
out), compared field by field (``Timer.before``: a float, then an int),
which a compiled build runs natively. Before, timers
were kept by instant: a heap of the distinct instants (``heapq``, comparing
boxed floats generically), a map of instant to that instant's timers, and
lists per instant; at 1,000,000 jobs setting and popping them was about 4%
of the run's time (docs/performance.md, "Session 29").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar, cast

from corral.scheduler.heap import Ordered, pop, push

if TYPE_CHECKING:
    from mypy_extensions import i64

K = TypeVar("K")


class Timer(Ordered, Generic[K]):
    """Fire ``(key, token)`` at ``at``; ``seq`` (the order set) breaks ties."""

    __slots__ = ("at", "key", "seq", "token")

    def __init__(self, at: float, seq: i64, key: K, token: int) -> None:
        self.at = at
        self.seq = seq
        self.key = key
        self.token = token

    def before(self, entry: Ordered) -> bool:
        """Does this one fire before ``entry``?"""
        other = cast("Timer[K]", entry)  # a clock's heap holds its timers only
        if self.at != other.at:
            return self.at < other.at
        return self.seq < other.seq


class EventClock(Generic[K]):
    """Virtual time and its timers: ``(key, token)`` pairs, by the instant they fire (the
    world's keys are its jobs' runs: a timer that fires needs no look-up by job id)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Timer[K]] = []
        self._set: i64 = 0  # timers set so far: the next one's ``seq``

    def set_timer(self, when: float, key: K, token: int) -> None:
        """Fire ``(key, token)`` at ``when`` (never earlier than now)."""
        at = self.now if self.now > when else when  # ``max(when, now)``
        self._set += 1
        push(self._heap, Timer(at, self._set, key, token))

    def next_time(self) -> float | None:
        """When the earliest timer fires, or None when none is set."""
        return self._heap[0].at if self._heap else None

    def advance_to(self, when: float) -> None:
        if when < self.now:
            raise ValueError(f"a clock cannot go backwards ({when} < {self.now})")
        self.now = when

    def pop_due(self) -> list[Timer[K]]:
        """Remove and return the timers due now, in the order they fire."""
        heap, now = self._heap, self.now
        due: list[Timer[K]] = []
        while heap and heap[0].at <= now:
            due.append(pop(heap))
        return due

    def __len__(self) -> int:
        return len(self._heap)
