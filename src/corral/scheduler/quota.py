"""Team quotas: guaranteed GPUs, borrowing limits and weights, in milli-GPUs.

A team's *usage* is the milli-GPUs its active allocations hold (CPU-offloaded
work counts nothing). Its *quota* is guaranteed; past it the team borrows
idle capacity, up to ``quota + borrow_limit`` (no limit when unset). The
pipeline serves every team's within-quota work before anyone's borrowing
(two passes), and only within-quota work may reclaim borrowed capacity by
preemption. Teams missing from the snapshot get no quota and no limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from corral.core.model import Allocation, Team
from corral.core.resources import MILLI


class Store(Protocol):
    """Where usage lives: a dict, or a ``Cycle.memo()`` so what-ifs roll back."""

    def get(self, key: str) -> int | None: ...

    def put(self, key: str, value: int) -> None: ...


class DictStore:
    def __init__(self) -> None:
        self._data: dict[str, int] = {}

    def get(self, key: str) -> int | None:
        return self._data.get(key)

    def put(self, key: str, value: int) -> None:
        self._data[key] = value


class Ledger:
    """Usage per team during one cycle, updated as placements and evictions are decided."""

    def __init__(
        self,
        teams: Iterable[Team],
        allocations: Iterable[Allocation],
        store: Store | None = None,
    ) -> None:
        self._teams = {t.name: t for t in teams}
        self._usage: Store = store if store is not None else DictStore()
        for team, milli in usage(allocations).items():
            self._usage.put(team, milli)

    @classmethod
    def of_usage(
        cls, teams: Iterable[Team], used: Mapping[str, int], store: Store | None = None
    ) -> Ledger:
        """A ledger starting from known usage per team (kept between cycles by ``Scheduler``)."""
        ledger = cls(teams, (), store)
        for team, milli in used.items():
            if milli:
                ledger._usage.put(team, milli)
        return ledger

    def quota(self, team: str) -> int:
        """Guaranteed milli-GPUs of ``team``."""
        known = self._teams.get(team)
        return round(known.quota_gpus * MILLI) if known else 0

    def limit(self, team: str) -> int | None:
        """Most milli-GPUs ``team`` may hold, borrowing included; ``None``: no limit."""
        known = self._teams.get(team)
        if known is None or known.borrow_limit_gpus is None:
            return None
        return round((known.quota_gpus + known.borrow_limit_gpus) * MILLI)

    def weight(self, team: str) -> float:
        known = self._teams.get(team)
        return known.weight if known else 1.0

    def used(self, team: str) -> int:
        return self._usage.get(team) or 0

    def borrowed(self, team: str) -> int:
        """Milli-GPUs held past the quota."""
        return max(0, self.used(team) - self.quota(team))

    def within_quota(self, team: str, charge: int) -> bool:
        """``charge`` more keeps ``team`` at or under its guaranteed quota."""
        return self.used(team) + charge <= self.quota(team)

    def within_limit(self, team: str, charge: int) -> bool:
        """``charge`` more keeps ``team`` at or under quota + borrowing limit."""
        limit = self.limit(team)
        return limit is None or self.used(team) + charge <= limit

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
