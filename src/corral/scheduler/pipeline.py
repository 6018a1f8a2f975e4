"""``schedule``: the placement pipeline of one cycle.

    admit       unknown priority class -> unplaced (none); future not_before -> (wait)
    guaranteed  classes by rank; inside a class, fair round robin across users;
                only work that keeps its team within quota (may reclaim by preemption)
    borrowing   what was over quota, classes by rank; inside a class the team that
                borrows least per weight goes next, then fair across its users
    per job     (planner.py) static filters per node class -> best-fit search over
                the capacity index -> scorers choose among a few fits -> reserve;
                gangs all or nothing; preemption; CPU offload; batching; reasons

Pure: the snapshot is read, never changed; the same inputs give the same plan.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator

from corral.core.errors import InvalidSpec
from corral.core.model import Job, PriorityClass
from corral.scheduler.api import Config, Plan, ReasonCode, Remedy, Snapshot
from corral.scheduler.explain import simple
from corral.scheduler.ordering import FairQueue, by_rank
from corral.scheduler.planner import Planner
from corral.scheduler.quota import Ledger

DEFAULT_CONFIG = Config()


def schedule(
    snapshot: Snapshot, config: Config = DEFAULT_CONFIG, now: float = 0.0, seed: int = 0
) -> Plan:
    """Decide which queued jobs run where now, and what to preempt for them.

    Deterministic: ties are broken by order (submission time, ids, names), so
    equal inputs give equal plans. ``seed`` is part of the contract for
    policies that randomise; none of the current ones needs it.
    """
    _check_unique(snapshot)
    if not snapshot.queued:
        return Plan()
    classes = {c.name: c for c in config.priority_classes}
    planner = Planner(snapshot, config, now, classes)
    ready = _admit(planner, snapshot.queued, classes, now)
    deferred: dict[str, list[Job]] = defaultdict(list)
    running = _running_by_user(snapshot)
    for pclass in by_rank(config.priority_classes):
        jobs = ready.get(pclass.name)
        if not jobs:
            continue
        for job in FairQueue(jobs, config.user_weights, running[pclass.name]):
            if not planner.consider(job, pclass, guaranteed=True):
                deferred[pclass.name].append(job)
    for pclass in by_rank(config.priority_classes):
        jobs = deferred.get(pclass.name)
        if not jobs:
            continue
        for job in borrowing_order(jobs, planner.ledger, config, running[pclass.name]):
            planner.consider(job, pclass, guaranteed=False)
    return planner.plan()


def borrowing_order(
    jobs: list[Job], ledger: Ledger, config: Config, running: dict[str, float]
) -> Iterator[Job]:
    """Teams that borrow least per weight first; fair across users inside a team.

    A generator: each team's key is recomputed after the caller has decided
    the job just yielded, so a team that just borrowed more waits its turn.
    """
    per_team: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        per_team[job.team].append(job)
    queues = {t: FairQueue(js, config.user_weights, running) for t, js in per_team.items()}
    heap = [(ledger.borrowed(t) / ledger.weight(t), t) for t in queues]
    heapq.heapify(heap)
    while heap:
        _, team = heapq.heappop(heap)
        queue = queues[team]
        yield queue.pop()
        if queue:
            heapq.heappush(heap, (ledger.borrowed(team) / ledger.weight(team), team))


def _check_unique(snapshot: Snapshot) -> None:
    """Names that identify things must do so: a duplicate is bad input, named."""
    for field, names in (
        ("snapshot.nodes", [n.name for n in snapshot.nodes]),
        ("snapshot.queued", [j.id for j in snapshot.queued]),
        ("snapshot.allocations", [a.id for a in snapshot.allocations]),
        ("snapshot.teams", [t.name for t in snapshot.teams]),
    ):
        duplicate = _first_duplicate(names)
        if duplicate is not None:
            raise InvalidSpec(field, f"duplicate {duplicate!r}")


def _first_duplicate(names: list[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _admit(
    planner: Planner, queued: tuple[Job, ...], classes: dict[str, PriorityClass], now: float
) -> dict[str, list[Job]]:
    """Jobs that may be placed now, by class; the others are left with a reason."""
    ready: dict[str, list[Job]] = defaultdict(list)
    for job in queued:
        if job.priority not in classes:
            text = f"unknown priority class {job.priority!r}"
            planner.leave(job, simple(ReasonCode.UNKNOWN_PRIORITY, text, Remedy.NONE))
        elif job.not_before > now:
            text = f"retry backoff: not before {job.not_before - now:.0f}s from now"
            planner.leave(job, simple(ReasonCode.NOT_BEFORE, text, Remedy.WAIT))
        else:
            ready[job.priority].append(job)
    return ready


def _running_by_user(snapshot: Snapshot) -> dict[str, dict[str, float]]:
    """Active allocations per class and user: the tie-break that carries fairness over cycles."""
    counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for alloc in snapshot.allocations:
        if alloc.active:
            counts[alloc.priority][alloc.user] += 1
    return counts
