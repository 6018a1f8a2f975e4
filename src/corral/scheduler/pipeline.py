"""``schedule``: the placement pipeline of one cycle.

    admit      unknown priority class -> unplaced (none); future not_before -> (wait)
    order      classes by rank; inside a class, fair round robin across users
    place      static filters (per node class, cached) -> best-fit search over the
               capacity index -> scorers choose among a few fits -> reserve
    fallback   CPU offload when the class allows it and the job says cpu_fallback
    explain    what is left gets reasons with node counts and a remedy

Pure: the snapshot is read, never changed; the same inputs give the same plan.
"""

from __future__ import annotations

from collections import defaultdict

from corral.core.model import Job, PriorityClass
from corral.scheduler.api import (
    Config,
    Placement,
    Plan,
    Reason,
    ReasonCode,
    Remedy,
    Snapshot,
    Unplaced,
)
from corral.scheduler.cycle import Cycle
from corral.scheduler.explain import explain, simple
from corral.scheduler.fit import Fit
from corral.scheduler.need import Need, need_of
from corral.scheduler.ordering import FairQueue, by_rank

DEFAULT_CONFIG = Config()


def schedule(
    snapshot: Snapshot, config: Config = DEFAULT_CONFIG, now: float = 0.0, seed: int = 0
) -> Plan:
    """Decide which queued jobs run where now. Deterministic for equal inputs.

    ``seed`` is accepted for the contract; the current policies need no
    randomness (ties are broken by order), so equal inputs give equal plans.
    """
    run = _Run(snapshot, config, now)
    ready = run.admit(snapshot.queued)
    for pclass in by_rank(config.priority_classes):
        jobs = ready.get(pclass.name)
        if not jobs:
            continue
        running = run.running_by_user(pclass.name)
        for job in FairQueue(jobs, config.user_weights, running):
            run.consider(job, pclass)
    return run.plan()


class _Run:
    """Collects one cycle's decisions."""

    def __init__(self, snapshot: Snapshot, config: Config, now: float) -> None:
        self.snapshot = snapshot
        self.config = config
        self.now = now
        self.cycle = Cycle(snapshot, config, now)
        self.classes = {c.name: c for c in config.priority_classes}
        self.placements: list[Placement] = []
        self.unplaced: list[Unplaced] = []
        self.position = 0
        self._explained: dict[
            tuple[Need, str | None], tuple[int, tuple[tuple[Reason, ...], Remedy]]
        ] = {}

    def admit(self, queued: tuple[Job, ...]) -> dict[str, list[Job]]:
        """Jobs that may be placed now, by class; the others become unplaced."""
        ready: dict[str, list[Job]] = defaultdict(list)
        for job in queued:
            if job.priority not in self.classes:
                self.leave(
                    job,
                    *simple(
                        ReasonCode.UNKNOWN_PRIORITY,
                        f"unknown priority class {job.priority!r}",
                        Remedy.NONE,
                    ),
                )
            elif job.not_before > self.now:
                wait = job.not_before - self.now
                self.leave(
                    job,
                    *simple(
                        ReasonCode.NOT_BEFORE,
                        f"retry backoff: not before {wait:.0f}s from now",
                        Remedy.WAIT,
                    ),
                )
            else:
                ready[job.priority].append(job)
        return ready

    def running_by_user(self, pclass: str) -> dict[str, float]:
        counts: dict[str, float] = defaultdict(float)
        for alloc in self.snapshot.allocations:
            if alloc.active and alloc.priority == pclass:
                counts[alloc.user] += 1
        return counts

    def consider(self, job: Job, pclass: PriorityClass) -> None:
        limit = self.config.max_placements_per_cycle
        if limit is not None and len(self.placements) >= limit:
            self.leave(
                job,
                *simple(
                    ReasonCode.CYCLE_LIMIT, "placement limit of this cycle reached", Remedy.WAIT
                ),
            )
            return
        need = need_of(job)
        fits = self.fit_replicas(job, need)
        on_cpu = False
        if (
            fits is None
            and pclass.cpu_offload
            and job.resources.cpu_fallback
            and job.resources.wants_gpu
        ):
            fits = self.fit_replicas(job, need_of(job, on_cpu=True))
            on_cpu = fits is not None
        if fits is None:
            self.leave(job, *self.explain(need, job.model))
            return
        self.record(job, fits, on_cpu)

    def fit_replicas(self, job: Job, need: Need) -> list[Fit] | None:
        """All replicas placed on the working copy, or none (rolled back)."""
        mark = self.cycle.cap.checkpoint()
        fits: list[Fit] = []
        for _ in range(job.replicas):
            fit = self.cycle.find(need, job.model)
            if fit is None:
                self.cycle.cap.rollback(mark)
                return None
            self.cycle.take(fit)
            fits.append(fit)
        return fits

    def record(self, job: Job, fits: list[Fit], on_cpu: bool) -> None:
        attempt = job.attempt + 1
        for replica, fit in enumerate(fits):
            alloc_id = f"{job.id}/{attempt}" + (f"/r{replica}" if job.gang else "")
            self.placements.append(
                Placement(
                    allocation_id=alloc_id,
                    job_ids=(job.id,),
                    node=fit.node.name,
                    replica=replica,
                    gpu_indices=fit.gpus,
                    gpu_milli=fit.milli,
                    vram_bytes=fit.vram,
                    cpus=fit.cpus,
                    on_cpu=on_cpu,
                )
            )
        self.position += 1

    def explain(self, need: Need, model: str | None) -> tuple[tuple[Reason, ...], Remedy]:
        """Reasons for a need that fits nowhere; reused until capacity is given back."""
        key = (need, model)
        cached = self._explained.get(key)
        if cached is not None and cached[0] == self.cycle.cap.generation:
            return cached[1]
        result = explain(self.cycle, need, model)
        self._explained[key] = (self.cycle.cap.generation, result)
        return result

    def leave(self, job: Job, reasons: tuple[Reason, ...], remedy: Remedy) -> None:
        self.unplaced.append(Unplaced(job.id, self.position, reasons, remedy))
        self.position += 1

    def plan(self) -> Plan:
        return Plan(placements=tuple(self.placements), unplaced=tuple(self.unplaced))
