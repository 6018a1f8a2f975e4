"""Time as an input (STYLE.md habit 2).

Decision code never reads the clock; it is handed ``now``. Shells hold a
``Clock``: ``WallClock`` in the server and agent composition roots only,
``VirtualClock`` everywhere a test or the simulator needs time to pass
without sleeping.

The virtual clock only moves when told to. It keeps timers in one heap,
fired in the order ``(instant, order set)``. The simulator sets a timer when
a job will finish, asks for the earliest (``next_time``), jumps there
(``advance_to``) and handles everything due at that instant together
(``pop_due``); a timer carries a token so that one made stale by a preemption
is ignored when it fires (lazy deletion: cheaper than removing it from the
heap). A test's sleepers are timers too: ``advance`` moves time on and wakes
the sleepers now due, so a test never really sleeps.

The heap is written out for ``Timer`` (``heapq``'s algorithm, comparing by
``Timer.before``: the instant, then the order set) rather than kept as a heap
of tuples: setting and popping timers is on the simulator's hot path
(docs/performance.md, "Simulator"). The fair queue's heap of users
(``scheduler/ordering.py``) is the same algorithm for its own entries.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.compiled import mypyc_attr

if TYPE_CHECKING:
    from mypy_extensions import i64


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


@mypyc_attr(acyclic=True)  # its key never refers back to it (core/compiled.py)
class Timer:
    """Fire ``(key, token)`` at ``at``; ``seq`` (the order set) breaks ties. Not generic
    in its key: a compiled build's acyclic class has no generic base."""

    __slots__ = ("at", "key", "seq", "token")

    def __init__(self, at: float, seq: i64, key: Any, token: int) -> None:
        self.at = at
        self.seq = seq
        self.key = key
        self.token = token

    def before(self, other: Timer) -> bool:
        """Does this one fire before ``other``?"""
        if self.at != other.at:
            return self.at < other.at
        return self.seq < other.seq


class VirtualClock:
    """Virtual time and its timers: ``(key, token)`` pairs, by the instant they fire (the
    simulator's keys are its jobs' runs: a timer that fires needs no look-up by job id).

    Its owner either handles the timers it sets (``set_timer``, ``next_time``,
    ``advance_to``, ``pop_due``: the simulator) or lets tasks ``sleep`` and moves time on
    with ``advance``, which wakes them (tests); one clock does not mix the two.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[Timer] = []
        self._set: i64 = 0  # timers set so far: the next one's ``seq``
        # A sleeper's future, by the token of its timer: the timer holds only the token, so
        # that it never refers back to the task that waits (``Timer`` is acyclic).
        self._sleepers: dict[int, asyncio.Future[None]] = {}

    def now(self) -> float:
        return self._now

    def set_timer(self, when: float, key: Any, token: int) -> None:
        """Fire ``(key, token)`` at ``when`` (never earlier than now)."""
        at = self._now if self._now > when else when  # ``max(when, now)``
        self._set += 1
        heap = self._heap
        heap.append(Timer(at, self._set, key, token))
        _sift_down(heap, len(heap) - 1)

    def next_time(self) -> float | None:
        """When the earliest timer fires, or None when none is set."""
        return self._heap[0].at if self._heap else None

    def advance_to(self, when: float) -> None:
        if when < self._now:
            raise ValueError(f"a clock cannot go backwards ({when} < {self._now})")
        self._now = when

    def pop_due(self) -> list[Timer]:
        """Remove and return the timers due now, in the order they fire."""
        heap, now = self._heap, self._now
        due: list[Timer] = []
        while heap and heap[0].at <= now:
            due.append(_pop(heap))
        return due

    async def sleep(self, seconds: float) -> None:
        """Wait until ``advance`` has moved time ``seconds`` on."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        token = int(self._set) + 1  # this timer's ``seq``: unique among the sleepers
        self._sleepers[token] = fut
        self.set_timer(self._now + seconds, None, token)
        try:
            await fut
        finally:
            self._sleepers.pop(token, None)

    def next_deadline(self) -> float | None:
        """The earliest instant a sleeper still waits for, or None when none waits (the
        timers of cancelled sleepers are dropped, so that time does not jump to them)."""
        heap = self._heap
        while heap and heap[0].token not in self._sleepers:
            _pop(heap)
        return heap[0].at if heap else None

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` and wake the sleepers now due, in the order due."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self.advance_to(self._now + seconds)
        for timer in self.pop_due():
            fut = self._sleepers.pop(timer.token, None)
            if fut is not None and not fut.done():  # a cancelled sleeper's is done
                fut.set_result(None)


# ``heapq``'s sifts written out for ``Timer`` (the same algorithm), comparing by
# ``Timer.before``.


def _pop(heap: list[Timer]) -> Timer:
    """Remove and return the root (the timer that fires first)."""
    last = heap.pop()
    if not heap:
        return last
    first = heap[0]
    heap[0] = last
    _sift_up(heap)
    return first


def _sift_down(heap: list[Timer], pos: i64) -> None:
    """The timer at ``pos`` moves towards the root while it fires before its parent."""
    item = heap[pos]
    while pos > 0:
        parent: i64 = (pos - 1) >> 1
        above = heap[parent]
        if not item.before(above):
            break
        heap[pos] = above
        pos = parent
    heap[pos] = item


def _sift_up(heap: list[Timer]) -> None:
    """The root's timer goes down to a leaf by the sooner child, then back up."""
    end: i64 = len(heap)
    item = heap[0]
    pos: i64 = 0
    child: i64 = 1
    while child < end:
        right: i64 = child + 1
        if right < end and not heap[child].before(heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    heap[pos] = item
    _sift_down(heap, pos)
