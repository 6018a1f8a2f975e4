"""The simulator's virtual clock: time jumps from one timer to the next.

Nothing sleeps. The world sets a timer when a job will finish; the runner
asks for the earliest timer, jumps there and handles everything due at that
instant together. A timer carries a token so that one made stale by a
preemption is ignored when it fires (lazy deletion: cheaper than removing
it from the heap).

Timers are kept by instant: a heap of the distinct instants, and per
instant its timers in the order they were set. Many jobs end at the same
instant (whole-second run times started at a cycle), and a heap of floats
compares floats where one of ``(when, seq, ...)`` tuples compared tuples:
the same order, ``(when, order set)``, for fewer and cheaper comparisons.
An instant's keys and tokens are two lists side by side (``Due``), not a
list of ``(key, token)`` pairs: a pair was made per timer, lived as long as
its job ran, and was read again when it fired, long out of the cache.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Generic, TypeVar

K = TypeVar("K")


class Due(Generic[K]):
    """Timers, in the order they were set: the ``i``-th fires ``(keys[i], tokens[i])``."""

    __slots__ = ("keys", "tokens")

    def __init__(self) -> None:
        self.keys: list[K] = []
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.keys)

    def pairs(self) -> list[tuple[K, int]]:
        """``(key, token)`` of each timer (made when asked: tests, not the hot path)."""
        return list(zip(self.keys, self.tokens, strict=True))


class EventClock(Generic[K]):
    """Virtual time and its timers: ``(key, token)`` pairs, by the instant they fire (the
    world's keys are its jobs' runs: a timer that fires needs no look-up by job id)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._instants: list[float] = []  # a heap: every instant that has timers
        self._at: dict[float, Due[K]] = {}  # instant -> its timers, in the order set
        self._count = 0

    def set_timer(self, when: float, key: K, token: int) -> None:
        """Fire ``(key, token)`` at ``when`` (never earlier than now)."""
        # ``Any``: one float object for the look-up, the map and the heap (a compiled
        # build boxes a ``float`` again at each use)
        instant: Any = max(when, self.now)
        timers = self._at.get(instant)
        if timers is None:
            timers = self._at[instant] = Due()
            heappush(self._instants, instant)
        timers.keys.append(key)
        timers.tokens.append(token)
        self._count += 1

    def next_time(self) -> float | None:
        """When the earliest timer fires, or None when none is set."""
        return self._instants[0] if self._instants else None

    def advance_to(self, when: float) -> None:
        if when < self.now:
            raise ValueError(f"a clock cannot go backwards ({when} < {self.now})")
        self.now = when

    def pop_due(self) -> Due[K]:
        """Remove and return the timers due now, in the order they were set (earlier
        instants first); none due: an empty ``Due``."""
        instants, now = self._instants, self.now
        if not instants or instants[0] > now:
            return Due()
        when: Any = heappop(instants)  # the heap's own float object, not unboxed and boxed
        due = self._at[when]
        del self._at[when]
        while instants and instants[0] <= now:
            when = heappop(instants)
            more = self._at[when]
            del self._at[when]
            due.keys.extend(more.keys)
            due.tokens.extend(more.tokens)
        self._count -= len(due.keys)
        return due

    def __len__(self) -> int:
        return self._count
