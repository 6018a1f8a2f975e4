"""Nodes in the order their work should end, kept between cycles.

A cycle that reserves nodes for a big job looks for the busy nodes whose work should
all end first (``reservation.py``): the nodes with a known expected end, soonest end
first, ties by node index (``Cycle.ends_in_order``). Sorting every node's end afresh
cost about 0.9M instructions per cycle that asked, at 1,000 nodes (compiled), while
between two cycles only the nodes where work started or ended have a new end.
``EndOrder`` keeps the last order, each node's end in it, and the nodes touched since;
it brings the order up to date by moving only those, each found and put back by a
binary search: the same list a fresh sort (``by_end``) gives. Ends are kept in a list by
node index, not looked up in the map: a compiled build boxes an index to look it up.
"""

from __future__ import annotations


class EndOrder:
    """The last order of a map node index -> expected end (kept by its owner,
    ``Scheduler``), and the nodes whose end was set or dropped since (``touch``)."""

    def __init__(self) -> None:
        self._order: list[int] | None = None  # as of the last ``of``; None: sort afresh
        self._end: list[float] = []  # by node index: its end in ``_order`` ...
        self._held: list[bool] = []  # ... when it is in it
        self._touched: set[int] = set()

    def touch(self, idx: int) -> None:
        """Node ``idx``'s end was set or dropped."""
        if self._order is not None:
            self._touched.add(idx)

    def forget(self) -> None:
        """Any end may have changed (the nodes changed): the next ``of`` sorts afresh."""
        self._order = None
        self._touched = set()

    def of(self, ends: dict[int, float]) -> list[int]:
        """The nodes of ``ends``, soonest end first, ties by index (not to be changed:
        the next call updates it in place)."""
        order, touched = self._order, self._touched
        if order is None or 2 * len(touched) > len(order):
            order = self._sorted(ends)
        else:
            for idx in touched:
                self._move(order, idx, ends.get(idx))
        self._order, self._touched = order, set()
        return order

    def _sorted(self, ends: dict[int, float]) -> list[int]:
        size = max(ends) + 1 if ends else 0
        self._end, self._held = [0.0] * size, [False] * size
        for idx, end in ends.items():
            self._end[idx], self._held[idx] = end, True
        return by_end(list(ends), ends)

    def _move(self, order: list[int], idx: int, end: float | None) -> None:
        """Node ``idx`` leaves ``order`` (if it was in it) and comes back with ``end``."""
        at, held = self._end, self._held
        if idx < len(held) and held[idx]:
            place = _place(order, at, at[idx], idx)
            if order[place] != idx:
                raise RuntimeError(f"end order lost node {idx}")
            del order[place]
            held[idx] = False
        if end is None:
            return
        if idx >= len(held):
            at.extend([0.0] * (idx + 1 - len(at)))
            held.extend([False] * (idx + 1 - len(held)))
        at[idx], held[idx] = end, True
        order.insert(_place(order, at, end, idx), idx)


def by_end(nodes: list[int], ends: dict[int, float]) -> list[int]:
    """``nodes`` (keys of ``ends``) soonest end first, ties by index, sorted in place: a
    stable sort by the float end of the nodes in index order, without a tuple per node
    (CPython compares homogeneous float keys with its fast comparison)."""
    nodes.sort()
    nodes.sort(key=ends.__getitem__)
    return nodes


def _place(order: list[int], at: list[float], end: float, idx: int) -> int:
    """The first position of ``order`` (nodes in (``at[node]``, node) order) whose node
    does not come before (``end``, ``idx``)."""
    low, high = 0, len(order)
    while low < high:
        mid = (low + high) // 2
        other = order[mid]
        other_end = at[other]
        if other_end < end or (other_end == end and other < idx):
            low = mid + 1
        else:
            high = mid
    return low
