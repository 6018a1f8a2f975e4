"""Expected start and end times: when will a queued job start, a running one end.

``estimate(snapshot, config, durations, now)`` replays the scheduler
forward from the snapshot with run times predicted from history
(``Durations``): every active allocation ends when its jobs are expected to
(by their progress, their own estimate, or jobs like them), and at each such
end the real scheduler (``Scheduler``, the same code, the same config) runs
a cycle on what is left: queued jobs are placed in its order, with its
backfill, reservations for big jobs, quotas and preemptions, and each
placed job holds its cards for its predicted run time. A job's ETA is the
time of the cycle that places it; a preempted job is queued again with the
rest of its run.

What it does not know: work submitted later that will be served first (a
higher class, or a user with less recent service), retries and failures,
nodes joining, leaving or pausing, models still to download, and how wrong
the predicted run times are. Its error is measured on a trace by
``bench/eta.py`` (docs/scheduler.md, "ETA").

Bounded: at most ``cycles`` replayed cycles; jobs still queued then get an
``Eta`` without a start (``beyond``). Pure: no I/O, ``now`` is an input.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from corral.core.model import EMPTY, Allocation, Job, Node
from corral.core.states import AllocObserved
from corral.scheduler.allocation import allocation_of
from corral.scheduler.api import Config, Placement, Plan, ReasonCode, Snapshot
from corral.scheduler.durations import Durations
from corral.scheduler.incremental import Scheduler
from corral.scheduler.served import ServiceLedger

CYCLES: Final = 2_000  # replayed cycles per estimate: a busy server's queue in about a second
WINDOW_S: Final = 3600.0  # the last hour's arrivals are expected again in the next
AGAIN: Final = 20  # cycles at one instant (preemptions free room the next one uses)
CPU_MODEL: Final = "cpu"  # the GPU model history keys a node without GPUs by


@dataclass(frozen=True, slots=True)
class Eta:
    """A job's expected start (queued jobs; None for a running job, and for one the replay
    never placed) and end, its predicted run time and what that rests on (``Durations``:
    history, estimate, progress, default; ``beyond``: past the replay's horizon;
    ``never``: no node it could run on was freed by the replay)."""

    job_id: str
    start_at: float | None
    end_at: float | None
    runtime_s: float
    basis: str


def estimate(  # noqa: PLR0913 (past ``now``: optional inputs, each by keyword)
    snapshot: Snapshot,
    config: Config,
    durations: Durations,
    now: float,
    *,
    running: Mapping[str, Job] = EMPTY,
    recent: Sequence[Job] = (),
    window_s: float = WINDOW_S,
    cycles: int = CYCLES,
    seed: int = 0,
) -> dict[str, Eta]:
    """An ``Eta`` for every queued job and every job of an active allocation.
    ``running``: the running jobs' specs by id (kind, backend, model, estimate: the
    snapshot's allocations do not carry them); one missing there is predicted from all of
    history. ``recent``: jobs submitted in the last ``window_s`` seconds; the replay expects
    as many again, submitted as they were, over the next ``window_s`` (work arriving
    later that the scheduler will serve first)."""
    models = {n.name: gpu_model(n) for n in snapshot.nodes}
    etas = _running(snapshot.allocations, models, durations, running, now)
    ends = {
        a.id: max(etas[j].end_at or now for j in a.job_ids)
        for a in snapshot.allocations
        if a.active
    }
    # a job placed by the cycle that just ran may still be listed as queued: it runs
    queued = tuple(j for j in snapshot.queued if j.id not in etas)
    replay = _Replay(replace(snapshot, queued=queued, expected_ends=ends), config, seed, now)
    likely = _Likely(snapshot.nodes)
    for job in queued:
        runtime, basis = durations.predict(job, likely.model(job))
        replay.add(job, runtime, basis)
    for job_id in (j for a in snapshot.allocations if a.active for j in a.job_ids):
        spec = running.get(job_id)
        eta = etas[job_id]
        if spec is not None and eta.end_at is not None:  # requeued with the rest, if preempted
            replay.rest[job_id] = (spec, eta.end_at, eta.basis)
    for alloc_id, end in ends.items():
        replay.timer(end, alloc_id)
    for job in recent:
        if now - window_s < job.submitted_at <= now:
            runtime, _ = durations.predict(job, likely.model(job))
            replay.expect(job, job.submitted_at + window_s, runtime)
    replay.run(now, cycles)
    for job_id, (start, runtime, basis) in replay.starts.items():
        if basis == "expected":
            continue
        if job_id in etas:  # a running job preempted and started again: a later end
            etas[job_id] = replace(etas[job_id], end_at=start + runtime)
        else:
            etas[job_id] = Eta(job_id, start, start + runtime, runtime, basis)
    left = "beyond" if replay.cut else "never"
    for job_id, (_, runtime, basis) in replay.waiting.items():
        if basis != "expected":
            etas.setdefault(job_id, Eta(job_id, None, None, runtime, left))
    return etas


def gpu_model(node: Node) -> str:
    """The GPU model run times on ``node`` are keyed by (its first card's)."""
    return node.gpus[0].model if node.gpus else CPU_MODEL


class _Likely:
    """The GPU model a queued job will most likely run on: its only allowed one, else the
    most common among the nodes it allows (one count per distinct set of allowed models)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self._nodes = nodes
        self._by_allowed: dict[frozenset[str], str] = {}

    def model(self, job: Job) -> str:
        res = job.resources
        if not res.gpus and not res.gpu_milli and not res.vram_bytes:
            return CPU_MODEL
        allowed = res.gpu_models
        if len(allowed) == 1:
            return next(iter(allowed))
        known = self._by_allowed.get(allowed)
        if known is None:
            counts: dict[str, int] = {}
            for n in self._nodes:
                if n.gpus and (not allowed or n.gpus[0].model in allowed):
                    counts[n.gpus[0].model] = counts.get(n.gpus[0].model, 0) + 1
            known = max(counts, key=counts.__getitem__) if counts else ""
            self._by_allowed[allowed] = known
        return known


def _running(
    allocations: Sequence[Allocation],
    models: Mapping[str, str],
    durations: Durations,
    running: Mapping[str, Job],
    now: float,
) -> dict[str, Eta]:
    """The expected end of each job of an active allocation (a gang's once)."""
    etas: dict[str, Eta] = {}
    for alloc in allocations:
        if not alloc.active:
            continue
        # placed but not started yet (its agent has not said so): it starts about now
        started = alloc.started_at if alloc.observed is AllocObserved.RUNNING else now
        elapsed = max(0.0, now - started)
        for job_id in alloc.job_ids:
            if job_id in etas:
                continue
            job = running.get(job_id) or Job(job_id)
            total, basis = durations.total(job, models.get(alloc.node, ""), elapsed, alloc.progress)
            end = max(now, started + total)
            etas[job_id] = Eta(job_id, None, end, total, basis)
    return etas


class _Replay:
    """The scheduler run forward on predicted run times; see the module docstring."""

    def __init__(self, snapshot: Snapshot, config: Config, seed: int, now: float) -> None:
        self.sched = Scheduler.from_snapshot(snapshot, config)
        # who was served lately, as the shells keep it: the fair order follows it
        self._service = ServiceLedger()
        for user, served in snapshot.served.items():
            self._service.record(user, now, served)
        self.config = config
        self.seed = seed
        self.waiting: dict[str, tuple[Job, float, str]] = {}  # queued: spec, run time, basis
        self.rest: dict[str, tuple[Job, float, str]] = {}  # running: spec, end, basis
        self.starts: dict[str, tuple[float, float, str]] = {}  # placed: start, run time, basis
        self._timers: list[tuple[float, str]] = []
        self._wakes: list[float] = []  # when running work becomes preemptible: cycle again
        self._preempting = config.preemption
        self._min_run = config.min_runtime_before_preemption_s
        self._coming: list[tuple[float, str, Job, float]] = []  # expected arrivals
        self._expected: set[str] = set()  # ids of the expected arrivals
        self._live = {a.id for a in snapshot.allocations if a.active}
        for a in snapshot.allocations:
            if a.active:
                self._wake(a)
        self._allocs = 0
        self.cut = False  # stopped at the cycle bound with jobs still queued

    def add(self, job: Job, runtime: float, basis: str) -> None:
        self.waiting[job.id] = (job, runtime, basis)

    def expect(self, job: Job, at: float, runtime: float) -> None:
        """A job like ``job`` is expected to arrive at ``at`` (it gets no ``Eta``)."""
        heapq.heappush(self._coming, (at, job.id, job, runtime))

    def timer(self, at: float, alloc_id: str) -> None:
        heapq.heappush(self._timers, (at, alloc_id))

    def run(self, now: float, cycles: int) -> None:
        t = now
        for _ in range(cycles):
            if not self.waiting.keys() - self._expected:
                return
            self._cycles(t)
            nxt = self._next(t)
            if nxt is None:
                return  # nothing more will end or become ready: the rest never starts
            t = nxt
            self._end_due(t)
            self._arrive_due(t)
        self.cut = bool(self.waiting.keys() - self._expected)

    def _arrive_due(self, t: float) -> None:
        while self._coming and self._coming[0][0] <= t:
            at, job_id, job, runtime = heapq.heappop(self._coming)
            twin = replace(job, id=f"{job_id}~eta", submitted_at=at, attempt=0, not_before=0.0)
            if twin.id in self.waiting:
                continue
            self._expected.add(twin.id)
            self.waiting[twin.id] = (twin, runtime, "expected")
            self.sched.submit(twin)

    def _cycles(self, t: float) -> None:
        """Cycles at ``t`` until one neither preempts nor stops at the placement limit."""
        for _ in range(AGAIN):
            self.sched.served = self._service.view(t)
            plan = self.sched.schedule(t, self.seed, explain=False)
            for victim in plan.preemptions:
                self._preempt(victim.allocation_id, victim.job_ids, t)
            for alloc_id, borrowed in plan.reflags:  # as the server's applier and the sim do
                if alloc_id in self._live:  # not one this plan preempted (ended here at once)
                    self.sched.reflag(alloc_id, borrowed)
            placed: dict[str, None] = {}
            for p in plan.placements:
                if self._place(p, t):
                    placed.update(dict.fromkeys(p.job_ids))
            for job_id in placed:  # a gang's replicas all placed: it leaves the queue once
                spec, each, basis = self.waiting.pop(job_id)
                self._service.record(spec.user, t)
                self.sched.withdraw(job_id)
                self.starts[job_id] = (t, each, basis)
                self.rest[job_id] = (spec, t + each, basis)
            if not plan.preemptions and not _hit_limit(plan):
                return

    def _place(self, p: Placement, t: float) -> bool:
        """Start placement ``p`` at ``t`` (False: it names no job still queued)."""
        first = self.waiting.get(p.job_ids[0])
        if first is None:
            return False
        runtime = max(self.waiting[j][1] for j in p.job_ids if j in self.waiting)
        job = first[0]
        self._allocs += 1
        alloc = allocation_of(
            p, job, id=f"eta-{self._allocs}", started_at=t, observed=AllocObserved.RUNNING
        )
        end = t + runtime
        self.sched.start(alloc, end)
        self._live.add(alloc.id)
        self._wake(alloc)
        self.timer(end, alloc.id)
        return True

    def _wake(self, alloc: Allocation) -> None:
        """Cycle again when ``alloc`` has run the minimum time before preemption."""
        if self._preempting and alloc.preemptible and self._min_run > 0:
            heapq.heappush(self._wakes, alloc.started_at + self._min_run)

    def _preempt(self, alloc_id: str, job_ids: tuple[str, ...], t: float) -> None:
        """End the allocation; its jobs queue again with the rest of their run."""
        if alloc_id not in self._live:
            return  # another replica of the same gang went already
        self._live.discard(alloc_id)
        self.sched.end(alloc_id)
        for job_id in job_ids:
            rest = self.rest.pop(job_id, None)
            if rest is None or job_id in self.waiting:
                continue
            spec = replace(rest[0], attempt=rest[0].attempt + 1)
            self.waiting[job_id] = (spec, max(1.0, rest[1] - t), rest[2])
            self.starts.pop(job_id, None)
            self.sched.submit(spec)

    def _next(self, t: float) -> float | None:
        """When something next changes: an allocation ends, or a back-off ends."""
        wakes = self._wakes
        while wakes and wakes[0] <= t:
            heapq.heappop(wakes)
        ends = self._timers[0][0] if self._timers else None
        for soon in (self._coming[0][0] if self._coming else None, wakes[0] if wakes else None):
            if soon is not None and (ends is None or soon < ends):
                ends = soon
        waiting = self.waiting.values()
        backoff = min((j.not_before for j, _, _ in waiting if j.not_before > t), default=None)
        if ends is None:
            return backoff
        return ends if backoff is None else min(ends, backoff)

    def _end_due(self, t: float) -> None:
        while self._timers and self._timers[0][0] <= t:
            _, alloc_id = heapq.heappop(self._timers)
            if alloc_id in self._live:
                self._live.discard(alloc_id)
                self.sched.end(alloc_id)


def _hit_limit(plan: Plan) -> bool:
    return any(r.code is ReasonCode.CYCLE_LIMIT for u in plan.unplaced for r in u.reasons)
