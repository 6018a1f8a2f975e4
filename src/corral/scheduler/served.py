"""Recent service per user, so fair mixing carries over from cycle to cycle.

Inside one cycle the fair queue serves users round robin. Across cycles it
needs memory: on a node that runs one job at a time, every cycle places a
single job while nobody has anything running, and without memory the same
user (the one with the oldest job) would win every time, so one user's
10,000 jobs would delay another user's single job behind all of them.

The shell (server loop, simulator) keeps a ``ServiceLedger``, records each
placement, and hands ``view(now)`` to the scheduler as ``Snapshot.served``;
the fair queue counts it like running work when it breaks ties. The ledger
is pure: time is passed in, and service decays with a half-life so old
history fades.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

from corral.scheduler.slots import RunningCount

HALF_LIFE_S: Final = 600.0
"""Service ten minutes ago counts half: long enough to span many short jobs,
short enough that yesterday's heavy user is not punished today."""

FORGET_BELOW: Final = 0.01  # a user whose service decayed below this is dropped


class ServiceLedger:
    """Decayed count of placements per user."""

    def __init__(self, half_life_s: float = HALF_LIFE_S) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life_s = half_life_s
        self._value: dict[str, _Served] = {}

    def record(self, user: str, now: float, jobs: float = 1.0) -> None:
        """``user`` was served ``jobs`` placements at ``now``."""
        got = self._value.get(user)
        if got is None:
            self._value[user] = _Served(jobs, now)
            return
        got.value = self._decayed(got, now) + jobs
        got.at = now

    def view(self, now: float) -> Mapping[str, float]:
        """Every user's decayed service at ``now`` (users whose service faded are dropped)."""
        out: dict[str, float] = {}
        faded: list[str] = []
        for user, got in self._value.items():
            value = self._decayed(got, now)
            if value >= FORGET_BELOW:
                out[user] = value
            else:
                faded.append(user)
        for user in faded:
            del self._value[user]
        return out

    def _decayed(self, got: _Served, now: float) -> float:
        elapsed = now - got.at
        if not elapsed > 0:  # no time passed (or the clock went back): no decay
            return got.value
        return got.value * math.pow(0.5, elapsed / self.half_life_s)


class _Served:
    """A user's service (``value``) as of a time (``at``)."""

    __slots__ = ("at", "value")

    def __init__(self, value: float, at: float) -> None:
        self.value = value
        self.at = at


def with_served(
    running: Mapping[str, Mapping[str, RunningCount]],
    served: Mapping[str, float],
    classes: Iterable[str],
) -> dict[str, dict[str, float]]:
    """Running work per class (of ``classes``) and user, from the kept counts, plus each
    user's recent service (all classes)."""
    out: dict[str, dict[str, float]] = {}
    for name in classes:
        users = {user: kept.count for user, kept in running.get(name, {}).items()}
        for user, value in served.items():
            users[user] = users.get(user, 0.0) + value
        out[name] = users
    return out
