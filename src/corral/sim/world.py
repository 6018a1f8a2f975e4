"""The simulated cluster: what is queued, what runs where, and applying plans.

The world is the simulator's imperative shell, playing the part the server
plays in production: it keeps the state the scheduler decides about, hands
``schedule`` a ``Snapshot`` of it, and applies the returned ``Plan``.
State is kept incrementally (queued jobs and active allocations in insertion-ordered
dicts, free capacity per GPU in a record per card: ``sim/free.py``), so a snapshot costs
two tuple copies and applying a placement is O(GPUs it takes); no node is rebuilt per event.

Applying checks the plan as the server's verifier would: a placement that
over-commits a node (``sim/free.py``), names a job that is not queued, or places part
of a gang raises ``PlanRejected`` (a scheduler bug) instead of being half applied.

Over 400 lines on purpose: placing, starting, ending and requeueing all change the same
records (runs, allocations, team use, the nodes' free capacity), which one class keeps
consistent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from corral.core.clock import VirtualClock
from corral.core.gate import transition
from corral.core.model import DEFAULT_TEAM, Allocation, Job, Node, Team
from corral.core.resources import MILLI
from corral.core.states import JOB as JOB_LIFECYCLE
from corral.core.states import AllocObserved, JobState
from corral.scheduler.allocation import allocation_of
from corral.scheduler.api import Placement, Plan, Preemption, Snapshot
from corral.sim.errors import PlanRejected, SimInputError
from corral.sim.free import NodeFree
from corral.sim.observing import Observer, observing
from corral.sim.report import JobRecord, Metrics, PlacementRecord
from corral.sim.runs import JobRun, TeamUse, cap_milli
from corral.sim.scenario import Scenario, SimJob

if TYPE_CHECKING:
    from mypy_extensions import i64

Sink = Callable[[JobRecord], None]
JOB: Final = JOB_LIFECYCLE
QUEUED: Final = JobState.QUEUED
PLACED: Final = JobState.PLACED
RUNNING: Final = JobState.RUNNING
SUCCEEDED: Final = JobState.SUCCEEDED
ALLOC_RUNNING: Final = AllocObserved.RUNNING


class World:
    """State of a simulated cluster; see the module docstring."""

    def __init__(
        self,
        scenario: Scenario,
        clock: VirtualClock,
        metrics: Metrics,
        *,
        sink: Sink | None = None,
        observer: Observer | None = None,
        snapshots: bool = True,
    ) -> None:
        self.nodes = scenario.nodes
        self._observer = observing(observer)
        self._clock = clock
        self._metrics = metrics
        self._sink = sink
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        self._free = [NodeFree(n) for n in self.nodes]  # by node position
        self.teams: dict[str, Team] = {t.name: t for t in scenario.teams}
        self._teams_view = tuple(self.teams.values())
        self._auto_teams = scenario.auto_teams
        # per team: milli-GPUs held and the most it may hold, one record (one look-up a change)
        self._team_use = {t.name: TeamUse(cap_milli(t)) for t in scenario.teams}
        # queued jobs in queue order, for snapshots (None: none taken), and their count
        self.queued: dict[str, Job] | None = {} if snapshots else None
        self.waiting: i64 = 0
        self.allocations: dict[str, Allocation] = {}
        self.runs: dict[str, JobRun] = {}
        self._records: dict[str, list[PlacementRecord]] = {}
        # allocation -> start + estimate left, for snapshots (None: none taken)
        self._expected_ends: dict[str, float] | None = {} if snapshots else None
        self.served: Mapping[str, float] = {}  # users' recent service, as the server keeps it
        self._batch_left: dict[str, int] = {}
        self._plans: i64 = 0  # plans applied: a run notes the number of the one placing it

    @property
    def gpu_free(self) -> list[list[int]]:
        """Each node's free milli-GPUs by card index, by node position (new lists, made when
        asked: the fragmentation sampler's, every minute of simulated time)."""
        return [[card.free for card in free.cards] for free in self._free]

    def snapshot(self) -> Snapshot:
        """The frozen view ``schedule`` gets: two tuple copies, nothing rebuilt."""
        if self.queued is None or self._expected_ends is None:
            raise RuntimeError("this world was made without snapshots (snapshots=False)")
        return Snapshot(
            nodes=self.nodes,
            queued=tuple(self.queued.values()),
            allocations=tuple(self.allocations.values()),
            teams=self._teams_view,
            expected_ends=self._expected_ends,
            served=self.served,
        )

    def submit(self, sim_job: SimJob) -> None:
        """A job arrives: it is queued."""
        job = sim_job.job
        run = JobRun(job, sim_job.duration, sim_job.where)
        if self.runs.setdefault(job.id, run) is not run:  # one look-up: test and store
            raise SimInputError(
                "id", f"job id {job.id!r} is still queued or running", sim_job.where
            )
        if job.team not in self.teams:
            try:
                self._add_team(job.team, sim_job.where)
            except SimInputError:
                del self.runs[job.id]  # nothing half-written
                raise
        if self._sink is not None:
            run.placements = []
        queued = self.queued
        if queued is not None:
            queued[job.id] = job
        self.waiting += 1
        self._metrics.arrived(job)
        self._observer.submitted(job)

    def apply(self, plan: Plan, now: float) -> list[JobRun]:
        """Apply a plan: preemptions first (they free room), then placements. Returns the
        runs of the jobs it started, each once (a gang's too)."""
        ended: set[str] = set()
        for preemption in plan.preemptions:
            self._preempt(preemption, now, ended)
        # Every placed job checked before anything is taken: queued, placed whole and once
        # (each run counts the placements naming it: its ``claims`` in this plan's number).
        self._plans += 1
        number = self._plans
        runs: list[JobRun] = []
        firsts: list[JobRun] = []  # each placement's first job's run
        for p in plan.placements:
            first: JobRun | None = None
            for job_id in p.job_ids:
                run = self._claim(job_id, number)
                if run.claims == 1:
                    runs.append(run)
                if first is None:
                    first = run
            if first is None:
                raise PlanRejected(f"placement {p.allocation_id} places no job")
            firsts.append(first)
        for run in runs:
            if run.claims != run.job.replicas:
                raise PlanRejected(
                    f"the plan places {run.claims} of the {run.job.replicas} replicas of job "
                    f"{run.job.id!r}: a gang is all or nothing, a job is placed once"
                )
        for k, p in enumerate(plan.placements):
            self._allocate(p, firsts[k], now)
        for run in runs:
            self._start(run, now)
        return runs

    def complete(self, run: JobRun, token: int, now: float) -> bool:
        """A completion timer of ``run`` fired; False when it was stale (the job was
        preempted, or this run is over). The timer holds the run: no look-up by job id."""
        if run.token != token or run.state is not RUNNING:
            return False
        job_id = run.job.id
        self._leave(run.alloc, now)
        for alloc_id in run.more:
            self._leave(alloc_id, now)
        run.state = transition(JOB, job_id, RUNNING, SUCCEEDED, at=now, why="done")
        self._emit(run)
        return True

    def finish(self, end: float) -> None:
        """The simulation ends: count running allocations up to ``end``, emit every job."""
        for alloc_id in list(self.allocations):
            self._release(alloc_id, end, preempted=False, still_running=True)
        for run in list(self.runs.values()):
            if run.first_start is None:
                self._metrics.still_waiting(run.job, end - run.job.submitted_at)
            self._emit(run)

    def set_nodes(self, nodes: tuple[Node, ...]) -> None:
        """The cluster changed (autoscaling: a node joined, was drained or removed).

        Nodes kept (by name) keep what is free on them; a node that leaves must hold no
        allocation. O(nodes): it runs per autoscaling change, never per job."""
        names = {n.name for n in nodes}
        for alloc in self.allocations.values():
            if alloc.node not in names:
                raise PlanRejected(f"node {alloc.node!r} left while allocation {alloc.id} ran")
        free: list[NodeFree] = []
        for node in nodes:
            i = self._index.get(node.name)
            free.append(NodeFree(node) if i is None else self._free[i])  # joined: wholly free
        self.nodes = nodes
        self._index = {n.name: i for i, n in enumerate(nodes)}
        self._free = free
        self._observer.nodes_changed(nodes)

    # -- applying a plan -------------------------------------------------------------

    def _claim(self, job_id: str, number: i64) -> JobRun:
        """The run of a job that plan number ``number`` places, checked queued; the
        placement counted in its ``claims``."""
        run = self.runs.get(job_id)
        if run is None or run.state is not QUEUED:
            raise PlanRejected(f"the plan places job {job_id!r}, which is not queued")
        if run.plan == number:
            run.claims += 1
        else:
            run.plan = number
            run.claims = 1
        return run

    def _allocate(self, p: Placement, first: JobRun, now: float) -> None:
        """Start placement ``p``, whose first job's run is ``first``."""
        i = self._index.get(p.node)
        if i is None:
            raise PlanRejected(f"placement {p.allocation_id}: no node {p.node!r}")
        job = first.job
        alloc = allocation_of(
            p,
            job,
            id=p.allocation_id,
            attempt=first.attempts + 1,
            started_at=now,
            observed=ALLOC_RUNNING,
        )
        if self.allocations.setdefault(p.allocation_id, alloc) is not alloc:
            raise PlanRejected(f"placement {p.allocation_id}: allocation id already in use")
        try:
            self._free[i].take(p)
        except PlanRejected:
            del self.allocations[p.allocation_id]
            raise
        if len(p.job_ids) > 1:
            self._batch_left[p.allocation_id] = len(p.job_ids)
            runs = self.runs
            for job_id in p.job_ids:
                self._joined(runs[job_id], p, alloc, now)
        else:
            self._joined(first, p, alloc, now)
        self._count_team(job.team, alloc.milli)
        estimate = job.estimated_runtime_s
        end: float | None = None
        if estimate is not None:
            end = now + max(0.0, estimate - first.done)
            ends = self._expected_ends
            if ends is not None:
                ends[p.allocation_id] = end
        self._observer.started(alloc, end)

    def _joined(self, run: JobRun, p: Placement, alloc: Allocation, now: float) -> None:
        """``run``'s job is one of those allocation ``alloc`` (of placement ``p``) runs."""
        if run.alloc:
            run.more = (*run.more, p.allocation_id)
        else:
            run.alloc = p.allocation_id
        if run.placements is not None:
            record = PlacementRecord(p.node, alloc.milli / MILLI, now)
            run.placements.append(record)
            self._records.setdefault(p.allocation_id, []).append(record)

    def _count_team(self, team: str, milli: int) -> None:
        use = self._team_use.get(team)
        if use is None:  # every job's team is added on submission; kept safe all the same
            use = self._team_use[team] = TeamUse(None)
        used = use.milli = use.milli + milli
        cap = use.cap
        if milli > 0 and cap is not None and used > cap:
            self._metrics.quota_violations += 1

    def _start(self, run: JobRun, now: float) -> None:
        job_id = run.job.id
        transition(JOB, job_id, QUEUED, PLACED, at=now, why="placed by the plan")
        run.state = transition(JOB, job_id, PLACED, RUNNING, at=now, why="started at once")
        run.attempts += 1
        run.token += 1
        run.started_at = now
        queued = self.queued
        if queued is not None:
            del queued[job_id]
        self.waiting -= 1
        self._observer.withdrawn(job_id)
        if run.first_start is None:
            run.first_start = now
            self._metrics.first_placed(run.job, now)
        if run.remaining is not None:
            self._clock.set_timer(now + run.remaining, run, run.token)

    def _preempt(self, preemption: Preemption, now: float, ended: set[str]) -> None:
        alloc = self.allocations.get(preemption.allocation_id)
        if alloc is None:
            if preemption.allocation_id in ended:
                return  # another replica of the same gang was preempted already
            raise PlanRejected(f"the plan preempts {preemption.allocation_id!r}, not active")
        if not alloc.preemptible:
            raise PlanRejected(f"the plan preempts {alloc.id!r}, which is not preemptible")
        for job_id in alloc.job_ids:
            run = self.runs[job_id]
            if run.state is RUNNING:
                ended.update(run.allocs())
                self._requeue(run, now, moved=bool(preemption.move_to))

    def _requeue(self, run: JobRun, now: float, *, moved: bool = False) -> None:
        """End every allocation of the job; it queues again and keeps the work it did.
        ``moved``: a consolidation move (counted apart from preemptions)."""
        for alloc_id in run.allocs():
            if alloc_id in self.allocations:
                self._release(alloc_id, now, preempted=True)
        run.alloc, run.more = "", ()
        run.done += now - run.started_at
        if run.remaining is not None:
            run.remaining = max(0.0, run.remaining - (now - run.started_at))
        job_id = run.job.id
        run.state = transition(JOB, job_id, RUNNING, QUEUED, at=now, why="preempted")
        run.token += 1
        run.job = replace(run.job, attempt=run.attempts)
        queued = self.queued
        if queued is not None:
            queued[job_id] = run.job
        self.waiting += 1
        if moved:
            self._metrics.consolidation_moves += 1
        else:
            self._metrics.preemptions += 1
        self._observer.submitted(run.job)

    # -- releasing -------------------------------------------------------------------

    def _leave(self, alloc_id: str, now: float) -> None:
        """A finished job leaves its allocation; a batch allocation ends with its last job."""
        # the map's size first: most runs batch nothing (no cold id's hash read for nothing)
        left = self._batch_left.get(alloc_id) if self._batch_left else None
        if left is not None and left > 1:
            self._batch_left[alloc_id] = left - 1
            return
        self._release(alloc_id, now, preempted=False)

    def _release(
        self, alloc_id: str, now: float, *, preempted: bool, still_running: bool = False
    ) -> None:
        alloc = self.allocations.pop(alloc_id)
        if self._batch_left and len(alloc.job_ids) > 1:  # the map's size first (``_leave``)
            self._batch_left.pop(alloc_id, None)
        ends = self._expected_ends
        if ends is not None and alloc_id in ends:
            del ends[alloc_id]
        self._observer.ended(alloc_id)
        self._free[self._index[alloc.node]].give_back(alloc)
        milli = alloc.milli
        use = self._team_use[alloc.team]
        use.milli = use.milli - milli
        self._metrics.allocation_ended(alloc.team, milli, now - alloc.started_at)
        if still_running or self._sink is None:
            return  # placement records are kept only for a sink
        for record in self._records.pop(alloc_id, ()):
            record.end = now
            record.preempted = preempted

    def _emit(self, run: JobRun) -> None:
        job = run.job
        del self.runs[job.id]
        self._metrics.job_done(run.state, placed=run.first_start is not None)
        if self._sink is None:
            return
        wait = None if run.first_start is None else run.first_start - job.submitted_at
        self._sink(
            JobRecord(
                id=job.id,
                state=run.state,
                team=job.team,
                user=job.user,
                priority=job.priority,
                submit_at=job.submitted_at,
                wait_s=wait,
                attempts=run.attempts,
                placements=run.placements or [],
            )
        )

    def _add_team(self, name: str, where: str) -> None:
        if not self._auto_teams and name != DEFAULT_TEAM:
            raise SimInputError("team", f"unknown team {name!r}", where)
        team = Team(name)
        self.teams[name] = team
        self._teams_view = tuple(self.teams.values())
        self._team_use[name] = TeamUse(cap_milli(team))
        self._observer.teams_changed(self._teams_view)
