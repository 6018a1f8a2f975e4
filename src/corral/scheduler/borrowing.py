"""Which running allocations are ``borrowed``: the fewest that cover a team's excess.

A team holding ``used`` milli-GPUs against a ``quota`` borrows ``used - quota``.
The flag marks which of its allocations stand for that excess: the first ones
reclaim takes (``victims.py`` orders them first) and what dashboards show as
borrowed. Usage changes under the flags (work ends, is evicted, quotas are
edited), so at the end of each cycle the flags are brought back to a minimal
cover: flagged milli-GPUs at least the excess, and no flagged allocation that
could be cleared without falling below it.

The oldest work keeps the quota (it came first and has the most to lose); the
youngest borrows. A team whose flags already form such a cover costs a
look at a few counters (``Flags``); only a team whose flags went wrong, or
that lost work to this cycle's evictions, has its allocations walked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.core.model import Allocation
from corral.core.states import AllocDesired


class Flags:
    """A team's flagged (``borrowed``) active allocations: milli-GPUs in all, and how many
    of each size (the smallest tells whether one could be cleared)."""

    __slots__ = ("milli", "sizes")

    def __init__(self) -> None:
        self.milli = 0
        self.sizes: dict[int, int] = {}

    def count(self, alloc: Allocation, sign: int) -> None:
        """``alloc`` starts (+1) or ends (-1) holding resources."""
        if not alloc.borrowed or alloc.on_cpu:
            return
        size = alloc.milli
        if size <= 0:
            return
        self.milli += sign * size
        left = self.sizes.get(size, 0) + sign
        if left:
            self.sizes[size] = left
        else:
            del self.sizes[size]

    def cover(self, excess: int, extra: int) -> bool:
        """Do these flags (plus ``extra`` flagged this cycle) form a minimal cover of
        ``excess``?"""
        flagged = self.milli + extra
        if flagged < excess:
            return False
        return not self.sizes or flagged - min(self.sizes) < excess


def reflag(
    allocs: Iterable[Allocation],
    excess: Mapping[str, int],
    extra: Mapping[str, int],
    gone: frozenset[str],
) -> list[tuple[str, bool]]:
    """(allocation id, new flag) for the teams in ``excess`` (team -> milli-GPUs held past
    its quota once the cycle's plan is applied): a minimal cover, oldest work unflagged
    first, youngest flagged first. ``extra``: milli-GPUs the plan places as borrowed, per
    team; ``gone``: allocations the plan evicts."""
    by_team: dict[str, list[Allocation]] = {team: [] for team in excess}
    for alloc in allocs:
        own = by_team.get(alloc.team)
        if own is not None and _counts(alloc) and alloc.id not in gone:
            own.append(alloc)
    changes: list[tuple[str, bool]] = []
    for team, own in sorted(by_team.items()):
        own.sort(key=_age)
        need = excess[team]
        flagged = extra.get(team, 0) + sum(a.milli for a in own if a.borrowed)
        flags = {a.id: a.borrowed for a in own}
        for alloc in own:  # oldest first: give back the flags that are not needed
            if flags[alloc.id] and flagged - alloc.milli >= need:
                flags[alloc.id] = False
                flagged -= alloc.milli
        for alloc in reversed(own):  # youngest first: flag what the excess still needs
            if flagged >= need:
                break
            if not flags[alloc.id]:
                flags[alloc.id] = True
                flagged += alloc.milli
        changes.extend((a.id, flags[a.id]) for a in own if flags[a.id] != a.borrowed)
    return changes


def _counts(alloc: Allocation) -> bool:
    """An allocation whose flag is kept: it holds GPUs and is meant to run on."""
    return (
        alloc.active and not alloc.on_cpu and alloc.milli > 0 and alloc.desired is AllocDesired.RUN
    )


def _age(alloc: Allocation) -> tuple[float, str]:
    return (alloc.started_at, alloc.id)
