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
Callers that schedule cycle after cycle (the simulator, the server's loop)
keep a ``Scheduler`` instead and tell it what changed.

Pure: the snapshot is read, never changed; the same inputs give the same plan.
"""

from __future__ import annotations

from corral.scheduler.api import Config, Plan, Snapshot
from corral.scheduler.incremental import DEFAULT_CONFIG, Scheduler

__all__ = ["DEFAULT_CONFIG", "schedule"]


def schedule(
    snapshot: Snapshot, config: Config = DEFAULT_CONFIG, now: float = 0.0, seed: int = 0
) -> Plan:
    """Decide which queued jobs run where now, and what to preempt for them.

    Deterministic: ties are broken by order (submission time, ids, names), so
    equal inputs give equal plans. ``seed`` is part of the contract for
    policies that randomise; none of the current ones needs it.
    """
    return Scheduler.from_snapshot(snapshot, config).once(now, seed)
