"""``Planner``: the decisions of one cycle, job by job.

For each job, in the order the pipeline gives: check the team's quota, find
room for every replica on the working copy (one replica, or a gang all or
nothing), else make room by preemption when the job is owed it, else run it
on CPU slots when its class allows and it says it can, else leave it queued
with reasons. A placed sample job takes compatible queued jobs into its
allocation (a batch).
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.core.model import Job, PriorityClass
from corral.core.resources import MILLI
from corral.scheduler.api import (
    Config,
    Placement,
    Plan,
    Preemption,
    Reason,
    ReasonCode,
    Remedy,
    Snapshot,
    Unplaced,
)
from corral.scheduler.batching import Batcher
from corral.scheduler.cycle import Cycle, Memo
from corral.scheduler.explain import explain, simple
from corral.scheduler.fit import Fit
from corral.scheduler.gang import place_gang
from corral.scheduler.need import Need, need_of
from corral.scheduler.preemption import Ask, Preemptor, Room
from corral.scheduler.quota import Ledger
from corral.scheduler.routing import ModelRouter

Explanation = tuple[tuple[Reason, ...], Remedy]


class Planner:
    """Collects one cycle's placements, preemptions and unplaced jobs."""

    def __init__(
        self, snapshot: Snapshot, config: Config, now: float, classes: Mapping[str, PriorityClass]
    ) -> None:
        self.config = config
        self.now = now
        self.classes = classes
        self.cycle = Cycle(snapshot, config, now)
        self.ledger = Ledger(snapshot.teams, snapshot.allocations, self.cycle.memo())
        self._allocations = snapshot.allocations
        self._preemptor: Preemptor | None = None  # built on first need: most cycles preempt nothing
        self.batcher = Batcher(snapshot.queued, config.max_batch_size)
        self.router = ModelRouter(self.cycle, config, snapshot.model_sizes)
        self._route = self.router.enabled  # wait for a model's holder when quicker (routing.py)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.unplaced: list[Unplaced] = []
        self.decided: set[str] = set()
        self.position = 0
        self._explained: Memo[tuple[Need, str | None], tuple[int, Explanation]] = self.cycle.memo()
        self._no_room: Memo[tuple[Need, Ask, bool], int] = self.cycle.memo()
        self._patient: Memo[tuple[Need, Ask, int], tuple[int, bool]] = self.cycle.memo()

    @property
    def preemptor(self) -> Preemptor:
        if self._preemptor is None:
            self._preemptor = Preemptor(
                self._allocations,
                self.classes,
                self.now,
                self.config.min_runtime_before_preemption_s,
                self.cycle,
            )
        return self._preemptor

    def consider(self, job: Job, pclass: PriorityClass, guaranteed: bool) -> bool:
        """Decide ``job``; ``False`` means "not now: it is over quota" (try when borrowing)."""
        if job.id in self.decided:
            return True
        limit = self.config.max_placements_per_cycle
        if limit is not None and len(self.placements) >= limit:
            self.leave(
                job, simple(ReasonCode.CYCLE_LIMIT, "cycle placement limit reached", Remedy.WAIT)
            )
            return True
        need = need_of(job)
        lowest = need.nominal_milli() * job.replicas
        if guaranteed and not self.ledger.within_quota(job.team, lowest):
            return False
        if not guaranteed and not self.ledger.within_limit(job.team, lowest):
            self.leave(job, self._quota_reason(job))
            return True
        return self._place(job, pclass, need, guaranteed)

    def _place(self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool) -> bool:
        mark = self.cycle.checkpoint()
        fits = self._fit_all(job, need)
        if fits is not None and self._route:
            wait = self.router.consider(job, need, fits[0], self.now)
            if wait is not None:
                self.cycle.rollback(mark)
                self.router.book(wait)
                self.leave(job, (wait.reasons, wait.remedy))
                return True
        rooms: list[Room] = []
        if fits is None and self.config.preemption:
            found = self._fit_with_preemption(job, pclass, need, guaranteed)
            if found is not None:
                fits, rooms = found
        if fits is not None:
            charge = sum(f.total_milli for f in fits)
            within = self.ledger.within_quota(job.team, charge)
            if guaranteed and not within:
                self.cycle.rollback(mark)
                return False
            if not guaranteed and not self.ledger.within_limit(job.team, charge):
                self.cycle.rollback(mark)
                self.leave(job, self._quota_reason(job))
                return True
            self._record(job, fits, on_cpu=False, borrowed=not within, rooms=rooms)
            return True
        cpu = pclass.cpu_offload and job.resources.cpu_fallback and job.resources.wants_gpu
        cpu_fits = self._fit_all(job, need_of(job, on_cpu=True)) if cpu else None
        if cpu_fits is not None:
            self._record(job, cpu_fits, on_cpu=True, borrowed=False, rooms=[])
            return True
        self.leave(job, self._explain(job, pclass, need, guaranteed))
        return True

    def _fit_with_preemption(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool, patient: bool = False
    ) -> tuple[list[Fit], list[Room]] | None:
        """Every replica where it fits, or where evictions make room; else none (rolled back)."""
        mark = self.cycle.checkpoint()
        fits: list[Fit] = []
        rooms: list[Room] = []
        for _ in range(job.replicas):
            fit = self.cycle.find(need, job.model)
            if fit is not None:
                self.cycle.take(fit, job.estimated_runtime_s)
                fits.append(fit)
                continue
            room = self._make_room(job, pclass, need, guaranteed, patient)
            if room is None:
                self.cycle.rollback(mark)
                return None
            fits.append(room.fit)
            rooms.append(room)
        return fits, rooms

    def _fit_all(self, job: Job, need: Need) -> list[Fit] | None:
        """All replicas on the working copy, or none (rolled back)."""
        if not job.gang:
            runtime = job.estimated_runtime_s
            fit = self.cycle.find(need, job.model, runtime)
            if fit is not None:
                self.cycle.take(fit, runtime)
            return None if fit is None else [fit]
        mark = self.cycle.checkpoint()
        fits = place_gang(self.cycle, need, job.replicas, job.gang_label)
        if fits is None:
            self.cycle.rollback(mark)
        return fits

    def _make_room(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool, patient: bool = False
    ) -> Room | None:
        ask = Ask(job.team, pclass.rank, reclaim=guaranteed, priority=pclass.can_preempt)
        if not (ask.reclaim or ask.priority):
            return None
        key = (need, ask, patient)
        if self._no_room.get(key) == self.cycle.cap.generation:
            return None
        room = self.preemptor.make_room(self.cycle, self.ledger, need, ask, patient=patient)
        if room is None:
            self._no_room.put(key, self.cycle.cap.generation)
        return room

    def _record(
        self, job: Job, fits: list[Fit], on_cpu: bool, borrowed: bool, rooms: list[Room]
    ) -> None:
        members = (job, *self.batcher.followers(job, self.decided)) if not job.gang else (job,)
        job_ids = tuple(j.id for j in members)
        self.decided.update(job_ids)
        by_node: dict[str, tuple[str, ...]] = {}
        for room in rooms:
            ids = tuple(a.id for v in room.victims for a in v.allocs)
            by_node[room.fit.node.name] = by_node.get(room.fit.node.name, ()) + ids
        for replica, fit in enumerate(fits):
            alloc_id = f"{job.id}/{job.attempt + 1}" + (f"/r{replica}" if job.gang else "")
            self.placements.append(
                Placement(
                    allocation_id=alloc_id,
                    job_ids=job_ids,
                    node=fit.node.name,
                    replica=replica,
                    gpu_indices=fit.node.to_indices(fit.gpus),
                    gpu_milli=fit.milli,
                    vram_bytes=fit.vram,
                    cpus=fit.cpus,
                    on_cpu=on_cpu,
                    borrowed=borrowed,
                    preempts=by_node.get(fit.node.name, ()),
                )
            )
            if not on_cpu:
                self.ledger.add(job.team, fit.total_milli)
        for victim in (v for room in rooms for v in room.victims):
            for alloc in victim.allocs:
                why = "reclaim borrowed capacity" if victim.team != job.team else "higher priority"
                self.preemptions.append(
                    Preemption(alloc.id, alloc.job_ids, alloc.node, job.id, f"{why} for {job.id}")
                )
        self.position += 1

    def _explain(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool
    ) -> Explanation:
        """Reasons for a job that fits nowhere; reused until capacity is given back."""
        key = (need, job.model)
        cached = self._explained.get(key)
        if cached is not None and cached[0] == self.cycle.cap.generation:
            reasons, remedy = cached[1]
        else:
            reasons, remedy = explain(self.cycle, need, job.model)
            self._explained.put(key, (self.cycle.cap.generation, (reasons, remedy)))
        if remedy is Remedy.WAIT and self._preemption_would_help(job, pclass, need, guaranteed):
            remedy = Remedy.PREEMPT
        return reasons, remedy

    def _preemption_would_help(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool
    ) -> bool:
        """Would evictions let the job fit once victims have run long enough? (a what-if)"""
        ask = Ask(job.team, pclass.rank, reclaim=guaranteed, priority=pclass.can_preempt)
        key = (need, ask, job.replicas)
        cached = self._patient.get(key)
        if cached is not None and cached[0] == self.cycle.cap.generation:
            return cached[1]
        mark = self.cycle.checkpoint()
        found = self._fit_with_preemption(job, pclass, need, guaranteed, patient=True)
        self.cycle.rollback(mark)
        self._patient.put(key, (self.cycle.cap.generation, found is not None))
        return found is not None

    def _quota_reason(self, job: Job) -> Explanation:
        limit = self.ledger.limit(job.team) or 0
        used = self.ledger.used(job.team) / MILLI
        text = (
            f"team {job.team} at its quota + borrowing limit ({used:g} of {limit / MILLI:g} GPUs)"
        )
        return simple(ReasonCode.QUOTA_EXCEEDED, text, Remedy.WAIT)

    def leave(self, job: Job, why: Explanation) -> None:
        self.decided.add(job.id)
        self.unplaced.append(Unplaced(job.id, self.position, why[0], why[1]))
        self.position += 1

    def plan(self) -> Plan:
        return Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            unplaced=tuple(self.unplaced),
        )
