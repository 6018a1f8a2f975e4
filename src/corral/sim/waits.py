"""Waits as the summary reads them: one record per distinct wait, ranked once.

A simulation's clock moves from event to event, so a million waits on a
generated trace hold a few thousand distinct values. ``Waits`` gives each
distinct value one record, which every list of the metrics shares: a whole
number of seconds below ``cap`` (every wait of a run whose jobs come and
cycles tick on whole seconds) is found by index in a list; any other value
in a map, which remembers the first ``cap`` of them (each later one has its
own record). The summary sorts the
distinct values once (``Waits.ranked``) and reads each group's percentiles by
counting the group's waits on their records and walking the records in order
(``Waits.ranks``): a count is a field, so no wait is hashed or compared again
per group. Where a group holds few waits among many distinct values, walking
every record would cost more than sorting the group's own values, which it
does instead. Percentiles are nearest rank: p95 of 20 values is the 19th
smallest.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mypy_extensions import i64

INTERNED: Final = 1 << 16  # distinct waits given one shared record each; the rest own theirs
SPARSE: Final = 4  # a group is sorted when the distinct waits outnumber its own this many times


class Wait:
    """One distinct wait, shared by every job that waited as long; ``count`` is scratch
    space for ``Waits.ranks`` (zero between calls)."""

    __slots__ = ("count", "value")

    def __init__(self, value: float) -> None:
        self.value = value
        self.count: i64 = 0

    def __repr__(self) -> str:
        return f"Wait({self.value!r})"


class Waits:
    """The distinct waits of a run, each one ``Wait`` (the first ``cap`` by value)."""

    def __init__(self, cap: int = INTERNED) -> None:
        self.cap = cap
        # whole seconds below ``cap`` by value, in a list (None: not seen yet); the rest by
        # value in a map
        self.whole: list[Wait | None] = []
        self.known: dict[float, Wait] = {}
        self.loose: list[Wait] = []  # made past the cap: one per job, not remembered
        self._ranked: list[Wait] | None = None

    def of(self, value: float) -> Wait:
        """The record of ``value``: the one equal waits share, or a new one."""
        if 0.0 <= value < self.cap:  # False for NaN: the map's
            at = int(value)
            if at == value:
                return self._whole(at, value)
        known = self.known
        wait = known.get(value)
        if wait is not None:
            return wait
        wait = Wait(value)
        if len(known) < self.cap:
            known[value] = wait
        else:
            self.loose.append(wait)
        self._ranked = None
        return wait

    def _whole(self, at: int, value: float) -> Wait:
        """The record of ``value``, a whole number of seconds ``at`` below the cap."""
        whole = self.whole
        if at < len(whole):
            wait = whole[at]
            if wait is not None:
                return wait
        else:
            whole.extend([None] * (at + 1 - len(whole)))
        wait = whole[at] = Wait(value)
        self._ranked = None
        return wait

    def ranked(self) -> list[Wait]:
        """Every record, by value (sorted once until a new one is made)."""
        ranked = self._ranked
        if ranked is None:
            records = [w for w in self.whole if w is not None]
            records.extend(self.known.values())
            records.extend(self.loose)
            records.sort(key=_value)  # the list just made: sorted in place, not copied
            ranked = self._ranked = records
        return ranked

    def ranks(self, group: list[Wait]) -> Ranks:
        """``group``'s waits in order (its records are among this book's)."""
        ranked = self.ranked()
        if len(ranked) > SPARSE * len(group):
            return Ranks(sorted([w.value for w in group]))
        for w in group:
            w.count += 1
        values: list[float] = []
        upto: list[int] = []
        seen: i64 = 0
        for w in ranked:
            count = w.count
            if count:
                seen += count
                values.append(w.value)
                upto.append(seen)
                w.count = 0
        return Ranks(values, upto)


def _value(wait: Wait) -> float:
    return wait.value


def mean(group: list[Wait]) -> float | None:
    """The mean of ``group``'s waits, rounded to 6 places (None: no waits)."""
    if not group:
        return None
    total = 0.0
    for w in group:
        total += w.value
    return round(total / len(group), 6)


class Ranks:
    """Values in order, for nearest-rank percentiles (``percentile``): ``values`` sorted,
    and ``upto[i]`` how many values are at most ``values[i]`` when they were counted
    (``Waits.ranks``; None: one each)."""

    def __init__(self, values: list[float], upto: list[int] | None = None) -> None:
        self.values = values
        self.upto = upto
        self.n = len(values) if upto is None else (upto[-1] if upto else 0)

    def kth(self, k: int) -> float:
        """The ``k``-th smallest value (from 1)."""
        if self.upto is None:
            return self.values[k - 1]
        return self.values[bisect_left(self.upto, k)]

    def percentile(self, pct: float, more: list[float] | None = None) -> float | None:
        """``percentile`` of these values, and of ``more`` with them when given (jobs still
        queued at the end, usually far fewer), without putting the union in order."""
        count = self.n + (len(more) if more else 0)
        if not count:
            return None
        k = _rank(pct, count)
        if not more:
            return self.kth(k)
        extra = sorted(more)
        upto = self.upto
        if upto is None:
            return kth(self.values, extra, k)
        values = self.values
        i = j = 0  # the next of ``values`` and of ``extra``
        while True:
            if j == len(extra) or (i < len(values) and values[i] <= extra[j]):
                value, i = values[i], i + 1
                seen = upto[i - 1] + j
            else:
                value, j = extra[j], j + 1
                seen = (upto[i - 1] if i else 0) + j
            if seen >= k:
                return value


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile: the smallest value with ``pct`` % of values at or below it."""
    if not values:
        return None
    return sorted(values)[_rank(pct, len(values)) - 1]


def _rank(pct: float, count: int) -> int:
    """The nearest rank (from 1) of percentile ``pct`` among ``count`` values."""
    return max(1, math.ceil(pct / 100 * count))


def kth(a: list[float], b: list[float], k: int) -> float:
    """The ``k``-th smallest (from 1) of two sorted lists together: ``sorted(a + b)[k - 1]``.

    A binary search for how many of the ``k`` come from ``a``: the least ``i`` such that
    ``a[i]`` (the next of ``a``) is not below ``b[k - i - 1]`` (the last taken of ``b``).
    """
    lo, hi = max(0, k - len(b)), min(k, len(a))
    while lo < hi:
        i = (lo + hi) // 2  # both indices valid here: i < len(a) and k - i >= 1
        if a[i] < b[k - i - 1]:
            lo = i + 1
        else:
            hi = i
    if lo == 0:
        return b[k - 1]
    if lo == k:
        return a[k - 1]
    return max(a[lo - 1], b[k - lo - 1])
