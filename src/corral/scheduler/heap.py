"""A binary heap of ``Ordered`` entries: ``heapq``'s algorithm written out.

The same sifts, pops and ties as ``heapq``, comparing by ``Ordered.before``, which a
compiled build calls natively (through the class's method table) where ``heapq``'s C calls
``__lt__`` generically (and pure Python would pay an interpreted ``__lt__`` per
comparison). Used by the fair queue's users (``ordering.LiveQueue``) and the simulator's
timers (``sim/clock.py``). Positions are ``i64``: machine integers in a compiled build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from mypy_extensions import i64


class Ordered:
    """An entry of a heap: ``before`` is its order (``<``)."""

    __slots__ = ()

    def before(self, other: Ordered) -> bool:
        raise NotImplementedError

    def __lt__(self, other: Ordered) -> bool:
        return self.before(other)


T = TypeVar("T", bound=Ordered)


def push(heap: list[T], entry: T) -> None:
    """``heapq.heappush``."""
    heap.append(entry)
    sift_down(heap, 0, len(heap) - 1)


def pop(heap: list[T]) -> T:
    """``heapq.heappop`` (the heap must not be empty)."""
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    heap[0] = last
    sift_up(heap, 0)
    return top


def heapify(heap: list[T]) -> None:
    """``heapq.heapify``."""
    pos: i64 = len(heap) // 2 - 1
    while pos >= 0:
        sift_up(heap, pos)
        pos -= 1


def sift_down(heap: list[T], start: i64, pos: i64) -> None:
    """``heapq._siftdown``: the entry at ``pos`` moves up towards ``start`` while it comes
    before its parent."""
    item = heap[pos]
    while pos > start:
        parent_pos: i64 = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not item.before(parent):
            break
        heap[pos] = parent
        pos = parent_pos
    heap[pos] = item


def sift_up(heap: list[T], pos: i64) -> None:
    """``heapq._siftup``: the lesser child moves up until a leaf, then the entry that was at
    ``pos`` sifts down from there."""
    end: i64 = len(heap)
    start, item = pos, heap[pos]
    child: i64 = 2 * pos + 1
    while child < end:
        right: i64 = child + 1
        if right < end and not heap[child].before(heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    heap[pos] = item
    sift_down(heap, start, pos)
