"""The simulator's virtual clock: time jumps from one timer to the next.

Nothing sleeps. The world sets a timer when a job will finish; the runner
asks for the earliest timer, jumps there and handles everything due at that
instant together. A timer carries a token so that one made stale by a
preemption is ignored when it fires (lazy deletion: cheaper than removing
it from the heap).

Timers fire in the order ``(instant, order set)``. Each is one ``Timer``
record in a heap written out here, compared field by field (``Timer.before``:
a float, then an int), which a compiled build runs natively. The fair queue's
heap of users (``scheduler/ordering.py``) is the same algorithm for its own
entries, on purpose: a compiled build calls ``before`` directly only on a
known class, and one heap shared through a base class cost 1.3% more
instructions at 100,000 jobs (each entry read from the list was checked
against the base class, a walk of its type's bases). Before, timers
were kept by instant: a heap of the distinct instants (``heapq``, comparing
boxed floats generically), a map of instant to that instant's timers, and
lists per instant; at 1,000,000 jobs setting and popping them was about 4%
of the run's time (docs/performance.md, "Session 29").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.core.compiled import mypyc_attr

if TYPE_CHECKING:
    from mypy_extensions import i64


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


class EventClock:
    """Virtual time and its timers: ``(key, token)`` pairs, by the instant they fire (the
    world's keys are its jobs' runs: a timer that fires needs no look-up by job id)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[Timer] = []
        self._set: i64 = 0  # timers set so far: the next one's ``seq``

    def set_timer(self, when: float, key: Any, token: int) -> None:
        """Fire ``(key, token)`` at ``when`` (never earlier than now)."""
        at = self.now if self.now > when else when  # ``max(when, now)``
        self._set += 1
        heap = self._heap
        heap.append(Timer(at, self._set, key, token))
        _sift_down(heap, len(heap) - 1)

    def next_time(self) -> float | None:
        """When the earliest timer fires, or None when none is set."""
        return self._heap[0].at if self._heap else None

    def advance_to(self, when: float) -> None:
        if when < self.now:
            raise ValueError(f"a clock cannot go backwards ({when} < {self.now})")
        self.now = when

    def pop_due(self) -> list[Timer]:
        """Remove and return the timers due now, in the order they fire."""
        heap, now = self._heap, self.now
        due: list[Timer] = []
        while heap and heap[0].at <= now:
            last = heap.pop()
            if heap:
                due.append(heap[0])
                heap[0] = last
                _sift_up(heap)
            else:
                due.append(last)
        return due

    def __len__(self) -> int:
        return len(self._heap)


# ``heapq``'s sifts written out for ``Timer`` (the same algorithm), comparing by
# ``Timer.before``, which a compiled build calls natively.


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
