"""The placement policies a simulation can run, by name, and how the runner drives them.

``corral`` is the real scheduler, kept between cycles (``Kept``: a
``corral.scheduler.Scheduler`` told every change the world makes, asked for
placements without explanations); ``corral-rebuild`` is the same scheduler
called the plain way, ``schedule(snapshot, ...)`` on a fresh snapshot every
cycle (the same plans, much slower: for comparison). The others are the
baselines of ``corral.sim.baselines``, called the plain way too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Protocol, cast

from corral.core.model import Allocation, Job, Node, Team
from corral.scheduler.api import Config, Plan, Snapshot
from corral.scheduler.incremental import Scheduler
from corral.sim.baselines import best_fit, first_fit
from corral.sim.errors import SimInputError
from corral.sim.observing import Observing
from corral.sim.scenario import Scenario

ScheduleFn = Callable[[Snapshot, Config, float, int], Plan]
"""The shape of ``corral.scheduler.schedule`` and of the baselines."""

POLICIES = ("corral", "first-fit", "best-fit", "corral-rebuild")


class Policy(Protocol):
    """What the runner drives: told each change to the world (``observing.Observer``), asked
    for a plan once per cycle, and after it for the next instant at which time alone may
    change its answer (``wake_at``; None: none, as for a policy without the method).
    ``snapshot`` builds the world's snapshot, when needed;
    ``served`` is users' recent service (``scheduler.served``), as the server keeps it.
    ``snapshots``: False when ``plan`` never calls ``snapshot`` (the world then keeps no
    maps of queued jobs and expected ends for it; a policy without the attribute is taken
    to call it)."""

    snapshots: bool

    def submitted(self, job: Job) -> None: ...

    def withdrawn(self, job_id: str) -> None: ...

    def started(self, alloc: Allocation, expected_end: float | None) -> None: ...

    def ended(self, alloc_id: str) -> None: ...

    def reflagged(self, alloc_id: str, borrowed: bool) -> None: ...

    def teams_changed(self, teams: tuple[Team, ...]) -> None: ...

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None: ...

    def plan(
        self,
        snapshot: Callable[[], Snapshot],
        config: Config,
        now: float,
        seed: int,
        served: Mapping[str, float],
    ) -> Plan: ...

    def wake_at(
        self, snapshot: Callable[[], Snapshot], config: Config, now: float
    ) -> float | None: ...


class Rebuilding(Observing):
    """A ``schedule``-shaped function, handed a fresh snapshot every cycle."""

    snapshots = True

    def __init__(self, schedule: ScheduleFn) -> None:
        self.schedule = schedule  # told every change, it keeps none (``Observing``'s no-ops)

    def plan(
        self,
        snapshot: Callable[[], Snapshot],
        config: Config,
        now: float,
        seed: int,
        served: Mapping[str, float],
    ) -> Plan:
        return self.schedule(snapshot(), config, now, seed)

    def wake_at(self, snapshot: Callable[[], Snapshot], config: Config, now: float) -> float | None:
        """corral's scheduler: its timers over a fresh snapshot (``scheduler.timers``); the
        baselines decide nothing by the clock."""
        if self.schedule is not _plain_schedule():
            return None
        return Scheduler.from_snapshot(snapshot(), config).wake_at(now)


class Kept(Observing):
    """corral's scheduler kept between cycles: the same plans as ``schedule`` on the world's
    snapshot, at the cost of what changed. ``unplaced`` is explained only when the scenario
    autoscales (the autoscaler reads its reason codes); otherwise nothing is explained."""

    snapshots = False  # told every change: never reads a snapshot

    def __init__(self, scenario: Scenario) -> None:
        self.scheduler = Scheduler(scenario.nodes, scenario.teams, scenario.config)
        self.explain = bool(scenario.pools)

    def submitted(self, job: Job) -> None:
        self.scheduler.submit(job)

    def withdrawn(self, job_id: str) -> None:
        self.scheduler.withdraw(job_id)

    def started(self, alloc: Allocation, expected_end: float | None) -> None:
        self.scheduler.start(alloc, expected_end)

    def ended(self, alloc_id: str) -> None:
        self.scheduler.end(alloc_id)

    def reflagged(self, alloc_id: str, borrowed: bool) -> None:
        self.scheduler.reflag(alloc_id, borrowed)

    def teams_changed(self, teams: tuple[Team, ...]) -> None:
        self.scheduler.set_teams(teams)

    def nodes_changed(self, nodes: tuple[Node, ...]) -> None:
        self.scheduler.set_nodes(nodes)

    def plan(
        self,
        snapshot: Callable[[], Snapshot],
        config: Config,
        now: float,
        seed: int,
        served: Mapping[str, float],
    ) -> Plan:
        self.scheduler.served = served
        return self.scheduler.schedule(now, seed, explain=self.explain)

    def wake_at(self, snapshot: Callable[[], Snapshot], config: Config, now: float) -> float | None:
        return self.scheduler.wake_at(now)


def resolve(name: str) -> ScheduleFn:
    """The ``schedule`` function called ``name`` (``corral``: ``corral.scheduler.schedule``)."""
    if name == "first-fit":
        return first_fit
    if name == "best-fit":
        return best_fit
    if name in ("corral", "corral-rebuild"):
        return corral_schedule()
    raise SimInputError("policy", f"unknown policy {name!r} (known: {', '.join(POLICIES)})")


def drive(policy: ScheduleFn | Policy | str, scenario: Scenario) -> Policy:
    """The ``Policy`` the runner drives for ``policy``: a name (``POLICIES``), a ``Policy``,
    or a ``schedule``-shaped function (``corral.scheduler.schedule`` is then kept between
    cycles: the same plans, faster; any other is handed a snapshot every cycle)."""
    if isinstance(policy, str):
        if policy == "corral":
            return Kept(scenario)
        return Rebuilding(resolve(policy))
    if isinstance(policy, Rebuilding | Kept) or hasattr(policy, "plan"):
        return cast(Policy, policy)
    if policy is _plain_schedule():
        return Kept(scenario)
    return Rebuilding(policy)


def corral_schedule() -> ScheduleFn:
    """``corral.scheduler.schedule``, looked up at run time so a build without it says so."""
    schedule = _plain_schedule()
    if schedule is None:
        raise SimInputError("policy", "corral.scheduler.schedule is not available in this build")
    return cast(ScheduleFn, schedule)


def _plain_schedule() -> object:
    return getattr(importlib.import_module("corral.scheduler"), "schedule", None)
