"""How good are ETAs? A simulation that predicts each job's start and then sees it.

``EtaProbe`` is corral's kept scheduler (``policies.Kept``) that also runs the
server's ETA estimate (``scheduler.eta``) on the state each cycle leaves,
learning run times (``scheduler.durations``) from the jobs that finish, as
the server does. It notes each job's first prediction (made at the first
estimate after the job was submitted and left queued) and, through the
run's sink, when the job really started. ``summary`` gives the errors,
absolute and relative to the job's actual wait, in all and per class and size.

Estimates run at most every ``every_s`` simulated seconds (the server
estimates every few seconds, not every cycle), so a prediction may be
made up to that long after submission. ``window_s`` > 0 hands the estimate
the jobs submitted in the last ``window_s`` seconds as ``recent`` (expected
again); 0, the server's way, hands none.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from corral.core.model import Allocation, Job
from corral.core.states import AllocObserved, JobState
from corral.scheduler.api import Config, Plan, Snapshot
from corral.scheduler.durations import Durations
from corral.scheduler.eta import estimate
from corral.sim.policies import Kept
from corral.sim.report import JobRecord
from corral.sim.scenario import Scenario

MIN_WAIT_S: Final = 60.0  # waits shorter than a cycle or two are "starts now": not rated
BIG_GPUS: Final = 8  # a whole node's worth: the jobs that wait longest, rated apart


@dataclass(frozen=True, slots=True)
class Prediction:
    made_at: float
    start_at: float
    priority: str = ""  # the job's class and whole GPUs (all replicas), to break errors down
    gpus: float = 0.0


class EtaProbe(Kept):
    """corral's scheduler plus the ETA estimate; see the module docstring."""

    snapshots = True  # the estimate reads the world's snapshot

    def __init__(self, scenario: Scenario, every_s: float = 30.0, window_s: float = 0.0) -> None:
        super().__init__(scenario)
        self.every_s = every_s
        self.durations = Durations()
        self.jobs: dict[str, Job] = {}  # in the world: the specs the estimate needs
        self.predicted: dict[str, Prediction] = {}
        self.starts: dict[str, tuple[float, float]] = {}  # job -> (submitted, first start)
        self._fresh: set[str] = set()
        self.window_s = window_s
        self._recent: deque[Job] = deque()  # submitted in the last window_s
        self._last = -math.inf
        self._models = {n.name: n.gpus[0].model if n.gpus else "cpu" for n in scenario.nodes}

    def submitted(self, job: Job) -> None:
        super().submitted(job)
        if job.id not in self.jobs:
            self._fresh.add(job.id)
            self._recent.append(job)
        self.jobs[job.id] = job

    def plan(
        self,
        snapshot: Callable[[], Snapshot],
        config: Config,
        now: float,
        seed: int,
        served: Mapping[str, float],
    ) -> Plan:
        plan = super().plan(snapshot, config, now, seed, served)
        if self._fresh and now - self._last >= self.every_s:
            self._last = now
            recent = self._recent
            while recent and recent[0].submitted_at <= now - self.window_s:
                recent.popleft()
            after = self._after(snapshot(), plan, now)
            etas = estimate(
                after,
                config,
                self.durations,
                now,
                running=self.jobs,
                recent=tuple(recent),
                window_s=self.window_s,
            )
            for job in after.queued:
                eta = etas.get(job.id)
                if job.id in self._fresh and eta is not None and eta.start_at is not None:
                    gpus = job.resources.gpus * job.replicas
                    self.predicted[job.id] = Prediction(now, eta.start_at, job.priority, gpus)
            self._fresh.clear()
        return plan

    def sink(self, rec: JobRecord) -> None:
        """The run's sink: a finished job's first start, and its run time learned."""
        job = self.jobs.pop(rec.id, None)
        self._fresh.discard(rec.id)
        if rec.wait_s is not None:
            self.starts[rec.id] = (rec.submit_at, rec.submit_at + rec.wait_s)
        if job is None or rec.state is not JobState.SUCCEEDED or rec.attempts != 1:
            return  # a preempted job's last placement is only part of its run
        last = rec.placements[-1] if rec.placements else None
        if last is not None and last.end is not None:
            self.durations.record(job, self._models.get(last.node, ""), last.end - last.start)

    def _after(self, snap: Snapshot, plan: Plan, now: float) -> Snapshot:
        """``snap`` as ``plan`` leaves it: placed jobs running, preempted ones queued."""
        placed = {j for p in plan.placements for j in p.job_ids}
        evicted = {p.allocation_id for p in plan.preemptions}
        requeued = {j: self.jobs[j] for p in plan.preemptions for j in p.job_ids if j in self.jobs}
        allocations = [a for a in snap.allocations if a.id not in evicted]
        for p in plan.placements:
            job = self.jobs.get(p.job_ids[0])
            allocations.append(
                Allocation(
                    p.allocation_id,
                    p.job_ids,
                    p.node,
                    team=job.team if job else "default",
                    user=job.user if job else "anonymous",
                    priority=job.priority if job else "free",
                    gpu_indices=p.gpu_indices,
                    gpu_milli=p.gpu_milli,
                    vram_bytes=p.vram_bytes,
                    cpus=p.cpus,
                    on_cpu=p.on_cpu,
                    memory_bytes=p.memory_bytes,
                    preemptible=job.preemptible if job else True,
                    borrowed=p.borrowed,
                    started_at=now,
                    observed=AllocObserved.RUNNING,
                )
            )
        served = dict(snap.served)  # the runner records this plan's service after it
        for job_id in placed:
            job = self.jobs.get(job_id)
            if job is not None:
                served[job.user] = served.get(job.user, 0.0) + 1.0
        queued = [j for j in snap.queued if j.id not in placed and j.id not in requeued]
        queued.extend(requeued.values())
        return Snapshot(
            nodes=snap.nodes,
            queued=tuple(queued),
            allocations=tuple(allocations),
            teams=snap.teams,
            served=served,
        )

    def summary(self, min_wait_s: float = MIN_WAIT_S) -> dict[str, Any]:
        """Errors of the first predictions of jobs that started after waiting at least
        ``min_wait_s``: median and p90 of |predicted - actual| start, in seconds and
        relative to the actual wait, the median signed relative error (negative:
        predicted early), and the same per class (``by_class``) and per size
        (``by_size``: ``small`` below 8 GPUs, ``big`` from 8)."""
        rated: list[tuple[Prediction, float, float]] = []  # prediction, actual start, wait
        for job_id, (submitted, start) in self.starts.items():
            p = self.predicted.get(job_id)
            wait = start - submitted
            if p is not None and wait >= min_wait_s:
                rated.append((p, start, wait))
        by_class: dict[str, list[tuple[Prediction, float, float]]] = {}
        by_size: dict[str, list[tuple[Prediction, float, float]]] = {}
        for r in rated:
            by_class.setdefault(r[0].priority, []).append(r)
            by_size.setdefault("big" if r[0].gpus >= BIG_GPUS else "small", []).append(r)
        return {
            **_errors(rated),
            "started": len(self.starts),
            "predicted": len(self.predicted),
            "by_class": {c: _errors(rs) for c, rs in sorted(by_class.items())},
            "by_size": {k: _errors(rs) for k, rs in sorted(by_size.items())},
        }


def _errors(rated: list[tuple[Prediction, float, float]]) -> dict[str, Any]:
    absolute = [abs(p.start_at - start) for p, start, _ in rated]
    relative = [abs(p.start_at - start) / wait for p, start, wait in rated]
    signed = [(p.start_at - start) / wait for p, start, wait in rated]
    return {
        "rated": len(rated),
        "median_error_s": _quantile(absolute, 0.5),
        "p90_error_s": _quantile(absolute, 0.9),
        "median_relative": _quantile(relative, 0.5),
        "p90_relative": _quantile(relative, 0.9),
        "median_signed_relative": _quantile(signed, 0.5),
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
