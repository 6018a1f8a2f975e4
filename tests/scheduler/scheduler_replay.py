"""A tiny world for multi-cycle scheduler tests: submit, run a cycle, apply the plan.

Applying does what the server or simulator would: placed jobs leave the queue
and become running allocations; preempted allocations stop and their jobs go
back to the queue with attempt + 1. Time is passed in; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from corral.core import Allocation, AllocObserved, Job, Node, Team
from corral.scheduler import DEFAULT_CONFIG, Config, Placement, Plan, Snapshot, schedule


class World:
    def __init__(
        self, nodes: Iterable[Node], teams: Iterable[Team] = (), config: Config = DEFAULT_CONFIG
    ) -> None:
        self.snapshot = Snapshot(nodes=tuple(nodes), teams=tuple(teams))
        self.config = config
        self.jobs: dict[str, Job] = {}
        self.plans: list[Plan] = []

    def submit(self, *jobs: Job) -> World:
        self.jobs.update((j.id, j) for j in jobs)
        self.snapshot = replace(self.snapshot, queued=self.snapshot.queued + tuple(jobs))
        return self

    def cycle(self, now: float) -> Plan:
        plan = schedule(self.snapshot, self.config, now=now, seed=0)
        self.snapshot = apply(self.snapshot, plan, now, self.jobs)
        self.plans.append(plan)
        return plan

    def finish(self, *job_ids: str) -> None:
        """The allocations of these jobs end (succeeded)."""
        gone = set(job_ids)
        kept = tuple(a for a in self.snapshot.allocations if not gone & set(a.job_ids))
        self.snapshot = replace(self.snapshot, allocations=kept)

    def gpus_of(self, team: str) -> float:
        return sum(a.milli for a in self.snapshot.allocations if a.team == team) / 1000

    def running(self, team: str | None = None) -> list[Allocation]:
        return [a for a in self.snapshot.allocations if team is None or a.team == team]


def apply(snapshot: Snapshot, plan: Plan, now: float, jobs: dict[str, Job]) -> Snapshot:
    """The snapshot after ``plan`` was carried out at ``now``."""
    evicted = {p.allocation_id for p in plan.preemptions}
    kept = [a for a in snapshot.allocations if a.id not in evicted]
    requeued_ids = {j for a in snapshot.allocations if a.id in evicted for j in a.job_ids}
    placed: set[str] = set()
    for p in plan.placements:
        lead = jobs[p.job_ids[0]]
        placed.update(p.job_ids)
        kept.append(_allocation(p, lead, now))
    requeued = [replace(jobs[j], attempt=jobs[j].attempt + 1) for j in sorted(requeued_ids)]
    for job in requeued:
        jobs[job.id] = job
    queued = [j for j in snapshot.queued if j.id not in placed] + requeued
    return replace(snapshot, queued=tuple(queued), allocations=tuple(kept))


def _allocation(p: Placement, lead: Job, now: float) -> Allocation:
    return Allocation(
        id=p.allocation_id,
        job_ids=p.job_ids,
        node=p.node,
        team=lead.team,
        user=lead.user,
        priority=lead.priority,
        replica=p.replica,
        gpu_indices=p.gpu_indices,
        gpu_milli=p.gpu_milli,
        vram_bytes=p.vram_bytes,
        cpus=p.cpus,
        on_cpu=p.on_cpu,
        memory_bytes=p.memory_bytes,
        preemptible=lead.preemptible,
        borrowed=p.borrowed,
        attempt=lead.attempt + 1,
        started_at=now,
        observed=AllocObserved.RUNNING,
    )
