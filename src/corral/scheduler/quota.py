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
from typing import Any

from corral.core.model import Allocation, Team
from corral.core.resources import MILLI
from corral.scheduler.cycle import Memo


class TeamBudget:
    """One team's entry in a ``Ledger``: its quota and limit in milli-GPUs (``limit`` None:
    no limit), its weight, and the milli-GPUs it holds now (``usage``)."""

    __slots__ = ("limit", "quota", "usage", "weight")

    def __init__(self, quota: int, limit: int | None, weight: float) -> None:
        self.quota = quota
        self.limit = limit
        self.weight = weight
        self.usage = 0

    def bound(self, borrowing: bool) -> float:
        """``Ledger.bound`` of this team."""
        if not borrowing:
            return self.quota
        limit = self.limit
        return math.inf if limit is None else limit

    def __setitem__(self, key: object, usage: int) -> None:
        """What ``Cycle.rollback`` writes back (``data[key] = old``, as into a memo's dict)."""
        self.usage = usage


class Ledger:
    """Usage per team during one cycle, updated as placements and evictions are decided.

    Each change of a team's usage is written to ``store``'s log (a ``Cycle.memo()``), so
    a what-if's changes roll back with the cycle's working copy."""

    def __init__(
        self,
        teams: Iterable[Team],
        allocations: Iterable[Allocation],
        store: Memo[str, int] | None = None,
    ) -> None:
        named = {t.name: t for t in teams}  # the last of a name, as a map of teams keeps it
        self._budgets: dict[str, TeamBudget] = {
            t.name: TeamBudget(
                round(t.quota_gpus * MILLI),
                None
                if t.borrow_limit_gpus is None
                else round((t.quota_gpus + t.borrow_limit_gpus) * MILLI),
                t.weight,
            )
            for t in named.values()
        }
        # Where changes are logged: a ``Cycle.memo()``'s log, so what-ifs roll back, or a
        # log of its own (nothing rolls it back)
        self._log: list[tuple[Any, Any, Any]] = store.log if store is not None else []
        for team, milli in usage(allocations).items():
            self.budget(team).usage = milli

    @classmethod
    def of_usage(
        cls, teams: Iterable[Team], used: Mapping[str, int], store: Memo[str, int] | None = None
    ) -> Ledger:
        """A ledger starting from known usage per team (kept between cycles by ``Scheduler``)."""
        ledger = cls(teams, (), store)
        for team, milli in used.items():
            if milli:
                ledger.budget(team).usage = milli
        return ledger

    def budget(self, team: str) -> TeamBudget:
        """``team``'s entry (a team missing from the snapshot gets one: no quota, no limit)."""
        budget = self._budgets.get(team)
        if budget is None:
            budget = self._budgets[team] = TeamBudget(0, None, 1.0)
        return budget

    def quota(self, team: str) -> int:
        """Guaranteed milli-GPUs of ``team``."""
        budget = self._budgets.get(team)
        return 0 if budget is None else budget.quota

    def limit(self, team: str) -> int | None:
        """Most milli-GPUs ``team`` may hold, borrowing included; ``None``: no limit."""
        budget = self._budgets.get(team)
        return None if budget is None else budget.limit

    def weight(self, team: str) -> float:
        budget = self._budgets.get(team)
        return 1.0 if budget is None else budget.weight

    def used(self, team: str) -> int:
        budget = self._budgets.get(team)
        return 0 if budget is None else budget.usage

    def borrowed(self, team: str) -> int:
        """Milli-GPUs held past the quota."""
        return max(0, self.used(team) - self.quota(team))

    def within_quota(self, team: str, charge: int) -> bool:
        """``charge`` more keeps ``team`` at or under its guaranteed quota."""
        budget = self._budgets.get(team)
        if budget is None:
            return charge <= 0
        return budget.usage + charge <= budget.quota

    def within_limit(self, team: str, charge: int) -> bool:
        """``charge`` more keeps ``team`` at or under quota + borrowing limit."""
        budget = self._budgets.get(team)
        if budget is None:
            return True
        limit = budget.limit
        return limit is None or budget.usage + charge <= limit

    def bound(self, team: str, borrowing: bool) -> float:
        """The most milli-GPUs ``team`` may hold: its quota, or (``borrowing``) its quota +
        borrowing limit (``inf`` without a limit)."""
        budget = self._budgets.get(team)
        if budget is None:
            return math.inf if borrowing else 0
        return budget.bound(borrowing)

    def headroom(self, team: str, borrowing: bool) -> float:
        """Milli-GPUs ``team`` may still take: up to its quota, or (``borrowing``) up to its
        quota + borrowing limit (``inf`` without a limit): ``bound`` less its usage."""
        return self.bound(team, borrowing) - self.used(team)

    def over_quota(self, team: str) -> bool:
        return self.used(team) > self.quota(team)

    def add(self, team: str, milli: int) -> None:
        """Charge (positive) or refund (negative) ``team``."""
        budget = self.budget(team)
        self._log.append((budget, None, budget.usage))  # rolled back by ``TeamBudget.__setitem__``
        budget.usage = budget.usage + milli


def usage(allocations: Iterable[Allocation]) -> dict[str, int]:
    """Milli-GPUs held per team by the active allocations (CPU offload counts nothing)."""
    totals: dict[str, int] = {}
    for alloc in allocations:
        if alloc.active and not alloc.on_cpu:
            totals[alloc.team] = totals.get(alloc.team, 0) + alloc.milli
    return totals
