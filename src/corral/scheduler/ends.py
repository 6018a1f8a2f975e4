"""When each node's running work should all have ended, kept in that order too.

A reservation for a big job looks for the busy nodes that should free up
first (``reservation.py``). Walking every node for them, once per head of
line per pass, was 5% of a long simulation; ``NodeEnds`` keeps the known
ends sorted as allocations start and end, so the soonest are read off the
front. Ties go to the lower node index, as a sort of ``(end, index)`` gives.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping


class NodeEnds:
    """Per node index, the latest expected end of its work (``of``), and the same
    entries as ``(end, index)`` soonest first (``order``)."""

    __slots__ = ("of", "order")

    def __init__(self, ends: Mapping[int, float] | None = None) -> None:
        self.of: dict[int, float] = {} if ends is None else dict(ends)
        self.order: list[tuple[float, int]] = sorted((end, idx) for idx, end in self.of.items())

    def set(self, idx: int, end: float) -> None:
        """Node ``idx``'s work should all have ended at ``end``."""
        old = self.of.get(idx)
        if old is not None:
            if old == end:
                return
            self._unlist(old, idx)
        self.of[idx] = end
        insort(self.order, (end, idx))

    def drop(self, idx: int) -> None:
        """Node ``idx`` has no known end any more."""
        old = self.of.pop(idx, None)
        if old is not None:
            self._unlist(old, idx)

    def _unlist(self, end: float, idx: int) -> None:
        order = self.order
        del order[bisect_left(order, (end, idx))]
