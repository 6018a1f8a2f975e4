"""Team quotas: guaranteed GPUs, borrowing limits and weights, in milli-GPUs.

A team's *usage* is the milli-GPUs its active allocations hold (CPU-offloaded
work counts nothing). Its *quota* is guaranteed; past it the team borrows
idle capacity, up to ``quota + borrow_limit`` (no limit when unset). The
pipeline serves every team's within-quota work before anyone's borrowing
(two passes), and only within-quota work may reclaim borrowed capacity by
preemption. Teams missing from the snapshot get no quota and no limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from corral.core.model import Allocation, Team
from corral.core.resources import MILLI
from corral.scheduler.cycle import Memo


class Ledger:
    """Usage per team during one cycle, updated as placements and evictions are decided."""

    def __init__(
        self,
        teams: Iterable[Team],
        allocations: Iterable[Allocation],
        store: Memo[str, int] | None = None,
    ) -> None:
        self._teams = {t.name: t for t in teams}
        self._quota = {t.name: round(t.quota_gpus * MILLI) for t in self._teams.values()}
        self._limit = {
            t.name: None
            if t.borrow_limit_gpus is None
            else round((t.quota_gpus + t.borrow_limit_gpus) * MILLI)
            for t in self._teams.values()
        }
        # Where usage lives: a ``Cycle.memo()``, so what-ifs roll back, or one of its own
        # (a class, not a protocol: a compiled build calls ``put`` natively per placement)
        self._usage: Memo[str, int] = store if store is not None else Memo([])
        self.usage: dict[str, int] = self._usage.data  # read-only: team -> milli-GPUs held
        for team, milli in usage(allocations).items():
            self._usage.put(team, milli)

    @classmethod
    def of_usage(
        cls, teams: Iterable[Team], used: Mapping[str, int], store: Memo[str, int] | None = None
    ) -> Ledger:
        """A ledger starting from known usage per team (kept between cycles by ``Scheduler``)."""
        ledger = cls(teams, (), store)
        for team, milli in used.items():
            if milli:
                ledger._usage.put(team, milli)
        return ledger

    def quota(self, team: str) -> int:
        """Guaranteed milli-GPUs of ``team``."""
        return self._quota.get(team, 0)

    def limit(self, team: str) -> int | None:
        """Most milli-GPUs ``team`` may hold, borrowing included; ``None``: no limit."""
        return self._limit.get(team)

    def weight(self, team: str) -> float:
        known = self._teams.get(team)
        return known.weight if known else 1.0

    def used(self, team: str) -> int:
        return self.usage.get(team) or 0

    def borrowed(self, team: str) -> int:
        """Milli-GPUs held past the quota."""
        return max(0, self.used(team) - self.quota(team))

    def within_quota(self, team: str, charge: int) -> bool:
        """``charge`` more keeps ``team`` at or under its guaranteed quota."""
        return (self.usage.get(team) or 0) + charge <= self._quota.get(team, 0)

    def within_limit(self, team: str, charge: int) -> bool:
        """``charge`` more keeps ``team`` at or under quota + borrowing limit."""
        limit = self._limit.get(team)
        return limit is None or (self.usage.get(team) or 0) + charge <= limit

    def bound(self, team: str, borrowing: bool) -> float:
        """The most milli-GPUs ``team`` may hold: its quota, or (``borrowing``) its quota +
        borrowing limit (``inf`` without a limit)."""
        if not borrowing:
            return self._quota.get(team, 0)
        limit = self._limit.get(team)
        if limit is None:  # two returns: one conditional expression of both is boxed
            return math.inf
        return limit

    def headroom(self, team: str, borrowing: bool) -> float:
        """Milli-GPUs ``team`` may still take: up to its quota, or (``borrowing``) up to its
        quota + borrowing limit (``inf`` without a limit): ``bound`` less its usage."""
        return self.bound(team, borrowing) - self.used(team)

    def over_quota(self, team: str) -> bool:
        return self.used(team) > self.quota(team)

    def add(self, team: str, milli: int) -> None:
        """Charge (positive) or refund (negative) ``team``."""
        self._usage.put(team, self.used(team) + milli)


def usage(allocations: Iterable[Allocation]) -> dict[str, int]:
    """Milli-GPUs held per team by the active allocations (CPU offload counts nothing)."""
    totals: dict[str, int] = {}
    for alloc in allocations:
        if alloc.active and not alloc.on_cpu:
            totals[alloc.team] = totals.get(alloc.team, 0) + alloc.milli
    return totals
