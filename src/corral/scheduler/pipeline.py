"""``schedule``: the placement pipeline of one cycle.

    admit       unknown priority class -> unplaced (none); future not_before -> (wait)
    guaranteed  classes by rank; inside a class, fair round robin across users;
                only work that keeps its team within quota (may reclaim by preemption)
    borrowing   what was over quota, classes by rank; inside a class the team that
                borrows least per weight goes next, then fair across its users
    per job     (planner.py) static filters per node class -> best-fit search over
                the capacity index -> scorers choose among a few fits -> reserve;
                gangs all or nothing; backfill reservations; preemption; CPU
                offload; batching; reasons

The passes live in ``passes.py``; the state they run on in ``incremental.py``:
``schedule`` builds a ``Scheduler`` from the snapshot and runs one cycle.
Callers that schedule cycle after cycle keep a ``Scheduler`` instead.

Pure: the snapshot is read, never changed; the same inputs give the same plan.
"""

from __future__ import annotations

from corral.core.model import Job
from corral.scheduler.api import Config, Plan, QueueDelta, Snapshot
from corral.scheduler.incremental import DEFAULT_CONFIG, Scheduler

__all__ = ["DEFAULT_CONFIG", "KeptSchedule", "schedule"]


def schedule(
    snapshot: Snapshot, config: Config = DEFAULT_CONFIG, now: float = 0.0, seed: int = 0
) -> Plan:
    """Decide which queued jobs run where now, and what to preempt for them.

    Deterministic: ties are broken by order (submission time, ids, names), so
    equal inputs give equal plans. ``seed`` is part of the contract for
    policies that randomise; none of the current ones needs it.
    """
    return Scheduler.from_snapshot(snapshot, config).once(now, seed)


class KeptSchedule:
    """``schedule``-shaped, for a caller that only has snapshots (the server's loop).

    Keeps a ``Scheduler`` and brings it to each snapshot by difference
    (``sync``: objects compared by identity, so a snapshot cache that reuses
    unchanged rows makes a call cost what changed, plus the explanations).
    The same plans as ``schedule``; a new config, or an error, starts afresh.
    """

    def __init__(self, *, explain: bool = True) -> None:
        self.explain = explain
        self._kept: Scheduler | None = None
        self._config: Config | None = None
        self._queued: tuple[Job, ...] | None = None  # the last snapshot's queued jobs

    def __call__(
        self,
        snapshot: Snapshot,
        config: Config = DEFAULT_CONFIG,
        now: float = 0.0,
        seed: int = 0,
        *,
        explain: bool | None = None,
        delta: QueueDelta | None = None,
    ) -> Plan:
        """``explain``: this call's choice (``Scheduler.schedule``); None: the one given at
        construction. ``delta``: how ``snapshot.queued`` differs from an earlier snapshot's
        (``QueueDelta``); used only when that snapshot is the last one given here."""
        explain = self.explain if explain is None else explain
        try:
            if self._kept is None or config != self._config:
                self._kept, self._config = Scheduler.from_snapshot(snapshot, config), config
            else:
                known = delta is not None and delta.base is self._queued
                self._kept.sync(snapshot, delta if known else None)
            self._queued = snapshot.queued
            return self._kept.schedule(now, seed, explain=explain)
        except BaseException:
            self._kept = self._queued = None  # whatever half-happened: start from the next one
            raise
