"""The discrete-event loop: replay a scenario through a ``schedule`` function.

Time jumps to the next thing that happens (an arrival, a completion, a due
scheduling cycle); nothing sleeps. Everything due at one instant is handled
together and then, if anything changed, one scheduling cycle runs: the
policy gets the world's snapshot and its plan is applied. A cycle whose plan
preempted something (or stopped at the per-cycle placement limit) is
followed by another at the same instant, so freed room is used at once.

With ``Scenario.cycle_interval_s`` > 0, cycles run only at multiples of the
interval, like a server whose scheduling loop ticks at that period; changes
in between are coalesced into the next tick.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

from corral.core.clock import VirtualClock
from corral.scheduler.api import Config, Plan, ReasonCode
from corral.scheduler.fragmentation import of_free
from corral.scheduler.served import ServiceLedger
from corral.sim.errors import PlanRejected, SimInputError
from corral.sim.observing import Observer
from corral.sim.policies import Policy, ScheduleFn, drive
from corral.sim.report import FragmentationSampler, Metrics
from corral.sim.scaling import Busy, Scaling
from corral.sim.scenario import Scenario, SimJob
from corral.sim.world import Sink, World

__all__ = ["MAX_CYCLES_PER_INSTANT", "Progress", "ScheduleFn", "simulate"]

MAX_CYCLES_PER_INSTANT: Final = 100  # a scheduler still preempting after this many is thrashing
PROGRESS_EVERY: Final = 20_000  # arrivals between progress reports
YOUNG_GC_EVERY: Final = 1_000_000  # net allocations between young-generation collections


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a run is, for a progress display."""

    now: float
    arrived: int
    queued: int
    running: int
    cycles: int
    done: bool = False


def simulate(
    scenario: Scenario,
    policy: ScheduleFn | Policy | str,
    *,
    until: float | None = None,
    seed: int | None = None,
    sink: Sink | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> dict[str, Any]:
    """Run ``scenario`` through ``policy``; return the report's ``summary``.

    ``policy``: a ``schedule``-shaped function, a policy name or a ``Policy``
    (``policies.drive``; corral's ``schedule`` is kept between cycles).
    ``until`` and ``seed`` override the scenario's. Job records go to ``sink``
    as jobs finish (and for the jobs still in the world at the end).
    """
    run = _Run(scenario, drive(policy, scenario), sink, progress)
    stop = scenario.until if until is None else until
    # A run makes millions of short-lived objects and few reference cycles: collecting
    # the young generation every YOUNG_GC_EVERY allocations instead of 700 saves about
    # 8% of a run's time. The count is of allocations net of deallocations, and a run
    # frees what it makes by reference counting: at a million, a 1,000,000-job run does
    # not collect once (at 100,000 it collected 9 times, 16 ms each, for the same peak
    # memory, 134 MB). The process's setting is restored after.
    threshold = gc.get_threshold()
    gc.set_threshold(max(YOUNG_GC_EVERY, threshold[0]), *threshold[1:])
    try:
        return run.loop(stop, scenario.seed if seed is None else seed)
    finally:
        gc.set_threshold(*threshold)


class _Run:
    """One simulation's mutable state; ``loop`` drives it."""

    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        sink: Sink | None,
        progress: Callable[[Progress], None] | None,
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.clock: VirtualClock = VirtualClock()
        self.metrics = Metrics()
        busy = Busy(policy) if scenario.pools else None
        observer: Observer = policy if busy is None else busy
        self.observer = observer  # told of flags the plans move (``_reflag``)
        self.world = World(
            scenario,
            self.clock,
            self.metrics,
            sink=sink,
            observer=observer,
            snapshots=getattr(policy, "snapshots", True),
        )
        self.scaling = None if busy is None else Scaling(scenario, self.world, busy)
        self.service = ServiceLedger()
        self.progress = progress
        self.arrived = 0
        measure = _fragmentation_measure(self.world)
        self.fragmentation = FragmentationSampler(measure, scenario.fragmentation_sample_s)

    def loop(self, until: float | None, seed: int) -> dict[str, Any]:
        arrivals = self.scenario.jobs()
        try:
            return self._loop(arrivals, until, seed)
        finally:
            # a stream that holds something (a file, a drawer process: ``generate.trace``)
            # is closed here, run to its end or not
            close = getattr(arrivals, "close", None)
            if close is not None:
                close()

    def _loop(self, arrivals: Iterator[SimJob], until: float | None, seed: int) -> dict[str, Any]:
        nxt = _first(arrivals)
        cycle_at: float | None = None
        wake: float | None = None  # when time alone may change the policy's answer
        scaling = self.scaling  # None without pools: one test per instant, nothing per job
        while True:
            t = _earliest(nxt, self.clock.next_time(), _sooner(cycle_at, wake))
            if scaling is not None:
                t = _sooner(t, scaling.next_time())
            if t is None or (until is not None and t > until):
                break
            self.clock.advance_to(t)
            changed, nxt = self._arrive(nxt, arrivals, t)
            changed = self._complete(t) or changed
            if wake is not None and wake <= t:
                wake, changed = None, True  # as the server's loop wakes for its timer
            if scaling is not None:
                changed = scaling.joins(t) or changed
                if changed:
                    scaling.wake(t)
            if changed and cycle_at is None:
                cycle_at = _next_tick(t, self.scenario.cycle_interval_s)
            if cycle_at == t:
                cycle_at = None
                self._cycles(t, seed)
                wake = self._wake_at(t)
                if self.fragmentation.due(t):
                    self.fragmentation.sample(t)
                if scaling is not None:
                    scaling.wake(t)  # the cycle changed what waits
            if scaling is not None and scaling.tick(t) and cycle_at is None:
                cycle_at = _next_tick(t, self.scenario.cycle_interval_s)  # nodes changed
        return self._finish(until)

    def _finish(self, until: float | None) -> dict[str, Any]:
        """End the run at ``until`` (or now) and build the summary."""
        scaling = self.scaling
        end = self.clock.now() if until is None else until
        if scaling is not None and until is None:
            end = scaling.changed_at  # not the last decision, which found nothing to do
        self.clock.advance_to(max(end, self.clock.now()))
        self.world.finish(end)
        self._report(done=True)
        weights = {name: team.weight for name, team in self.world.teams.items()}
        if scaling is None:
            summary = self.metrics.summary(end, self.scenario.total_gpus, weights)
        else:
            summary = self._scaled_summary(scaling, end, weights)
        summary["fragmentation"] = self.fragmentation.summary(end)
        if self.metrics.consolidation_moves:  # only where there were any: older reports stand
            summary["consolidation_moves"] = self.metrics.consolidation_moves
        return summary

    def _scaled_summary(
        self, scaling: Scaling, end: float, weights: dict[str, float]
    ) -> dict[str, Any]:
        """The summary when nodes came and went: the allocation ratio over the GPU-seconds
        that existed, ``gpus_total`` the most GPUs there were at once, and ``autoscaler``."""
        start = self.metrics.start if self.metrics.start is not None else end
        extra = scaling.capacity_gpu_s(start, end)
        summary = self.metrics.summary(end, scaling.static_gpus, weights, extra_gpu_s=extra)
        summary["gpus_total"] = scaling.peak_gpus
        summary["autoscaler"] = scaling.summary(end)
        return summary

    def _arrive(
        self, nxt: SimJob | None, arrivals: Iterator[SimJob], t: float
    ) -> tuple[bool, SimJob | None]:
        """Submit every job due at ``t``; return whether any came, and the next one."""
        changed = False
        while nxt is not None and nxt.submit_at <= t:
            self.world.submit(nxt)
            changed = True
            self.arrived += 1
            if self.progress is not None and self.arrived % PROGRESS_EVERY == 0:
                self._report()
            nxt = _first(arrivals)
            if nxt is not None and nxt.submit_at < t:
                raise SimInputError(
                    "submit_at",
                    f"jobs must come in submit_at order ({nxt.submit_at:g} < {t:g})",
                    nxt.where,
                )
        return changed, nxt

    def _cycles(self, now: float, seed: int) -> None:
        """Schedule until the plan neither preempts nor hits the per-cycle limit."""
        world, config = self.world, self.scenario.config
        for _ in range(MAX_CYCLES_PER_INSTANT):
            if not world.waiting:
                if self.scaling is not None:
                    self.scaling.unplaced = ()
                return
            world.served = served = self.service.view(now)  # fair mixing across cycles
            plan = self.policy.plan(world.snapshot, config, now, seed + self.metrics.cycles, served)
            self.metrics.cycles += 1
            if self.scaling is not None:
                self.scaling.unplaced = plan.unplaced  # the autoscaler's pending work
            service = self.service
            for run in world.apply(plan, now):  # each job started (a gang's once)
                service.record(run.job.user, now)
            if plan.reflags:
                self._reflag(plan.reflags)
            again = bool(plan.preemptions) or _hit_limit(plan, config)
            if not again or not (plan.placements or plan.preemptions):
                return
        raise PlanRejected(
            f"the scheduler did not settle at t={now:g}: still preempting after "
            f"{MAX_CYCLES_PER_INSTANT} cycles"
        )

    def _complete(self, t: float) -> bool:
        """End the work due at ``t``; whether any ended (a timer of a preempted attempt is
        stale and ends nothing)."""
        changed = False
        for timer in self.clock.pop_due():
            changed = self.world.complete(timer.key, timer.token, t) or changed
        return changed

    def _wake_at(self, now: float) -> float | None:
        """After a cycle at ``now``: the next instant at which the policy may decide
        differently with nothing arriving or ending (a victim passing its minimum run time,
        a backoff ending; ``scheduler.timers``), while anything waits."""
        wake_at = getattr(self.policy, "wake_at", None)
        if wake_at is None:
            return None
        if not self.world.waiting and getattr(self.policy, "snapshots", True):
            return None  # nothing to wake for, and a policy fed snapshots keeps no timers
        # asked with an empty queue too: a kept scheduler forgets the instants passed then
        when: float | None = wake_at(self.world.snapshot, self.scenario.config, now)
        return when if self.world.waiting else None

    def _reflag(self, reflags: tuple[tuple[str, bool], ...]) -> None:
        """A plan moved ``borrowed`` flags (usage changed under them: scheduler/borrowing.py),
        as the server's applier does."""
        held = self.world.allocations
        for alloc_id, borrowed in reflags:
            alloc = held.get(alloc_id)
            if alloc is not None and alloc.borrowed != borrowed:
                held[alloc_id] = replace(alloc, borrowed=borrowed)
                self.observer.reflagged(alloc_id, borrowed)

    def _report(self, *, done: bool = False) -> None:
        if self.progress is None:
            return
        world = self.world
        self.progress(
            Progress(
                now=self.clock.now(),
                arrived=self.arrived,
                queued=world.waiting,
                running=len(world.runs) - world.waiting,
                cycles=self.metrics.cycles,
                done=done,
            )
        )


def _fragmentation_measure(world: World) -> Callable[[], Any]:
    """The scheduler's fragmentation measure of ``world`` now, from its free cards
    (``of_free``: O(cards), no map)."""
    return lambda: of_free(world.nodes, world.gpu_free)


def _first(arrivals: Iterator[SimJob]) -> SimJob | None:
    """The next job of ``arrivals`` (None: no more)."""
    return next(arrivals, None)


def _earliest(nxt: SimJob | None, timer: float | None, cycle_at: float | None) -> float | None:
    """The soonest of what is next (None: nothing is). Once per instant: no list built."""
    best = None if nxt is None else nxt.submit_at
    if timer is not None and (best is None or timer < best):
        best = timer
    if cycle_at is not None and (best is None or cycle_at < best):
        best = cycle_at
    return best


def _sooner(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a <= b else b


def _next_tick(t: float, interval: float) -> float:
    """The first scheduling tick at or after ``t``."""
    if interval <= 0:
        return t
    tick = math.ceil(t / interval) * interval
    return tick if tick >= t else tick + interval  # float rounding


def _hit_limit(plan: Plan, config: Config) -> bool:
    if config.max_placements_per_cycle is None:
        return False
    return any(r.code is ReasonCode.CYCLE_LIMIT for u in plan.unplaced for r in u.reasons)
