"""Time as an input (STYLE.md habit 2).

Decision code never reads the clock; it is handed ``now``. Shells hold a
``Clock``: ``WallClock`` in the server and agent composition roots only,
``VirtualClock`` everywhere a test or the simulator needs time to pass
without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """Where shells get the time from."""

    def now(self) -> float:
        """Seconds since the epoch (wall) or since the start (virtual)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class WallClock:
    """The real clock. Instantiate only in composition roots."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class VirtualClock:
    """A clock that only moves when told to, or jumps to the next timer.

    ``advance`` moves time forward and wakes every sleeper whose deadline has
    passed, in deadline order. ``run_until_idle``-style autojump is what the
    simulator does with ``next_deadline``: nothing ever really sleeps.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self._now + seconds, next(self._seq), fut))
        await fut

    def next_deadline(self) -> float | None:
        """The earliest time a sleeper waits for, or None when nobody sleeps."""
        while self._timers and self._timers[0][2].done():
            heapq.heappop(self._timers)  # cancelled sleepers
        return self._timers[0][0] if self._timers else None

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake the sleepers now due."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds
        while self._timers and self._timers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._timers)
            if not fut.done():
                fut.set_result(None)
