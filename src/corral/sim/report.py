"""What a simulation measured: per-job records and the summary.

``Metrics`` is fed by the world as things happen, in O(1) per event, and
keeps only what the summary needs (waits, in a list per class, team, user and
size that share each wait's record, ``waits.Wait``: four pointers a job; every job's
list is the classes' joined), so a 1,000,000-job run does not keep a
million job records: each record is handed to a sink as soon as its job is
finished. Definitions (all in ``docs/sim.md``):

* wait: first placement time minus submission time, for jobs ever placed;
  the ``*_incl_queued_s`` figures also count every job still queued at the
  end as having waited until then (a policy that never starts some jobs
  must not look better for it: without them, the jobs it starves drop out);
* percentiles: nearest rank (p95 of 20 values is the 19th smallest);
* ``gpu_allocation_ratio``: GPU-seconds allocated / GPU-seconds that existed
  between ``start``, the first submission, and ``end``, the end of the
  simulation: GPUs x (end - start) for a fixed cluster, plus each autoscaled
  node's GPUs x its time in the cluster within that span;
* ``fragmentation``: the time-weighted mean of the scheduler's
  fragmentation score (0: every free GPU sits in a wholly free node) over
  samples taken after scheduling cycles;
* ``jain_fairness``: Jain's index over the teams that asked for GPUs, of
  each team's allocated GPU-seconds divided by its weight (1.0: every team
  got GPU time in proportion to its weight).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from corral.core.model import Job
from corral.core.resources import MILLI, ResourceRequest
from corral.core.states import JobState
from corral.sim.waits import Ranks, Wait, Waits, mean

RECENT_SIZES: Final = 8  # requests whose size buckets are found by identity (a trace has few)

T = TypeVar("T")


@dataclass(slots=True)
class PlacementRecord:
    """One allocation of a job: where, how many GPUs, from when to when."""

    node: str
    gpus: float
    start: float
    end: float | None = None
    preempted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpus": self.gpus,
            "start": self.start,
            "end": self.end,
            "preempted": self.preempted,
        }


@dataclass(slots=True)
class JobRecord:
    """A job's outcome, emitted once: when it finished, or at the end of the run."""

    id: str
    state: JobState
    team: str
    user: str
    priority: str
    submit_at: float
    wait_s: float | None
    attempts: int
    placements: list[PlacementRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "team": self.team,
            "user": self.user,
            "priority": self.priority,
            "submit_at": self.submit_at,
            "wait_s": self.wait_s,
            "attempts": self.attempts,
            "placements": [p.as_dict() for p in self.placements],
        }


class Metrics:
    """Counters and integrals for the summary, updated in O(1) per event."""

    def __init__(self) -> None:
        self.jobs_total = 0
        self._states: dict[JobState, int] = dict.fromkeys(JobState, 0)
        self.never_placed = 0
        self.preemptions = 0
        self.consolidation_moves = 0  # jobs stopped to run again elsewhere (not preemptions)
        self.quota_violations = 0
        self.cycles = 0
        self.start: float | None = None
        self.gpu_milli_s = 0.0
        self._team_milli_s: dict[str, float] = {}
        self.gpu_teams: set[str] = set()
        # Equal waits share one record (``waits.Waits``), which the summary ranks once and
        # counts groups on.
        self.distinct = Waits()
        self.queued_waits: list[float] = []  # jobs still queued at the end: their wait so far
        self.queued_by_gpus: dict[str, list[float]] = {}
        self.waits_by: dict[str, dict[str, list[Wait]]] = {
            "priority": {},
            "team": {},
            "user": {},
            "gpus": {},
        }
        # the same maps, held directly: ``first_placed`` runs per job
        self._by_priority = self.waits_by["priority"]
        self._by_team = self.waits_by["team"]
        self._by_user = self.waits_by["user"]
        self._by_gpus = self.waits_by["gpus"]
        self._sizes: list[tuple[ResourceRequest, int, list[Wait]]] = []  # ``_size_bucket``

    def arrived(self, job: Job) -> None:
        self.jobs_total += 1
        if self.start is None:
            self.start = job.submitted_at
        if job.resources.wants_gpu:
            self.gpu_teams.add(job.team)

    @property
    def waits(self) -> list[Wait]:
        """Every placed job's wait (a new list): the classes' lists joined. Not kept as a list
        of its own: at 1,000,000 jobs one more list of a million grew, and was copied as it
        grew, in the run."""
        every: list[Wait] = []
        for values in self._by_priority.values():
            every.extend(values)
        return every

    def first_placed(self, job: Job, now: float) -> None:
        wait = self.distinct.of(now - job.submitted_at)
        _bucket(self._by_priority, job.priority).append(wait)
        _bucket(self._by_team, job.team).append(wait)
        _bucket(self._by_user, job.user).append(wait)
        self._size_bucket(job).append(wait)

    def _size_bucket(self, job: Job) -> list[Wait]:
        """The waits of ``job``'s size (``_size``): for the first few requests seen, found
        by the request's identity and the replicas, without making the size's name again
        (a new string, hashed) per job."""
        r, replicas = job.resources, job.replicas
        for request, count, bucket in self._sizes:
            if request is r and count == replicas:
                return bucket
        bucket = _bucket(self._by_gpus, _size(job))
        if len(self._sizes) < RECENT_SIZES:
            self._sizes.append((r, replicas, bucket))  # holds ``r``: its identity stays its own
        return bucket

    def still_waiting(self, job: Job, waited: float) -> None:
        """``job`` was never placed; the simulation ended ``waited`` s after it came."""
        self.queued_waits.append(waited)
        _bucket(self.queued_by_gpus, _size(job)).append(waited)

    @property
    def team_milli_s(self) -> dict[str, float]:
        """Milli-GPU-seconds each team's ended allocations held (a new dict)."""
        return dict(self._team_milli_s)

    def allocation_ended(self, team: str, milli: int, seconds: float) -> None:
        used = milli * seconds
        self.gpu_milli_s += used
        self._team_milli_s[team] = self._team_milli_s.get(team, 0.0) + used

    @property
    def states(self) -> dict[JobState, int]:
        """How many jobs left the simulation in each state (a new dict)."""
        return dict(self._states)

    def job_done(self, state: JobState, *, placed: bool) -> None:
        """A job left the simulation (finished, or still there at the end)."""
        self._states[state] += 1
        if not placed:
            self.never_placed += 1

    def summary(
        self,
        end: float,
        total_gpus: int,
        weights: Mapping[str, float],
        *,
        extra_gpu_s: float | None = None,
    ) -> dict[str, Any]:
        """The ``summary`` object of the report (see the module docstring). ``total_gpus``
        were there all along; ``extra_gpu_s`` are GPU-seconds of nodes that came and went
        (autoscaling) between the start and ``end``."""
        start = self.start if self.start is not None else end
        states = self.states
        capacity = total_gpus * MILLI * (end - start)
        if extra_gpu_s is not None:
            capacity += extra_gpu_s * MILLI
        team_milli_s = self.team_milli_s
        fairness = jain(
            [team_milli_s.get(t, 0.0) / weights.get(t, 1.0) for t in sorted(self.gpu_teams)]
        )
        distinct, waits = self.distinct, self.waits
        ordered = distinct.ranks(waits)  # once: the p95 counting queued jobs reads it too
        p50, p95 = ordered.percentile(50), ordered.percentile(95)
        return {
            "jobs_total": self.jobs_total,
            "jobs_completed": states[JobState.SUCCEEDED],
            "jobs_running": states[JobState.RUNNING] + states[JobState.PLACED],
            "jobs_queued": states[JobState.QUEUED],
            "jobs_never_placed": self.never_placed,
            "preemptions": self.preemptions,
            "quota_violations": self.quota_violations,
            "gpu_allocation_ratio": round(self.gpu_milli_s / capacity, 6) if capacity else 0.0,
            "wait_p50_s": p50,
            "wait_p95_s": p95,
            "wait_mean_s": mean(waits),
            "wait_p95_incl_queued_s": ordered.percentile(95, self.queued_waits),
            "wait_by_priority": _groups(self.waits_by["priority"], distinct),
            "wait_by_team": _groups(self.waits_by["team"], distinct),
            "wait_by_user": _groups(self.waits_by["user"], distinct),
            "wait_by_gpus": _by_size(self.waits_by["gpus"], self.queued_by_gpus, distinct),
            "jain_fairness": None if fairness is None else round(fairness, 6),
            "gpu_seconds_by_team": {
                t: round(v / MILLI, 3) for t, v in sorted(team_milli_s.items())
            },
            "gpus_total": total_gpus,
            "start_s": start,
            "end_s": end,
            "cycles": self.cycles,
        }


class FragmentationSampler:
    """Time-weighted mean of the scheduler's fragmentation score, sampled after cycles.

    ``measure`` measures the cluster now (the runner's: the scheduler's
    ``fragmentation.of_free`` over the world's free cards; any callable giving
    an object with a ``score`` in 0..1). Measuring costs O(cards), so it runs
    at most every ``every_s`` simulated seconds; each sample holds until the
    next one.
    """

    def __init__(self, measure: Callable[[], Any], every_s: float) -> None:
        self.measure = measure
        self.every_s = every_s
        self.samples = 0
        self.first: float | None = None
        self.last_at = 0.0
        self.last_score = 0.0
        self.area = 0.0

    def due(self, now: float) -> bool:
        return self.first is None or now - self.last_at >= self.every_s

    def sample(self, now: float) -> None:
        score = float(self.measure().score)
        if self.first is None:
            self.first = now
        else:
            self.area += self.last_score * (now - self.last_at)
        self.samples += 1
        self.last_at, self.last_score = now, score

    def summary(self, end: float) -> dict[str, Any] | None:
        if self.first is None:
            return None
        span = end - self.first
        area = self.area + self.last_score * (end - self.last_at)
        mean = area / span if span > 0 else self.last_score
        return {
            "score_mean": round(mean, 6),
            "score_last": round(self.last_score, 6),
            "samples": self.samples,
        }


def jain(values: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 all equal, 1/n one takes all."""
    if not values:
        return None
    squares = sum(v * v for v in values)
    if squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


def _size(job: Job) -> str:
    """A job's size as a group name: ``"8"``, ``"2x8"`` (a gang), ``"0.5"``, ``"0"`` (CPU)."""
    r = job.resources
    per = str(r.gpus) if r.gpus else f"{r.gpu_milli / MILLI:g}"
    return per if job.replicas == 1 else f"{job.replicas}x{per}"


def _bucket(groups: dict[str, list[T]], key: str) -> list[T]:
    values = groups.get(key)
    if values is None:
        values = groups[key] = []
    return values


def _by_size(
    placed: Mapping[str, list[Wait]], queued: Mapping[str, list[float]], distinct: Waits
) -> dict[str, dict[str, Any]]:
    """``_groups`` by job size, with the jobs still queued at the end and the p95 counting
    them (see the module docstring)."""
    ordered: dict[str, Ranks] = {}
    out = _groups(placed, distinct, ordered)
    empty: list[float] = []
    for key in sorted(set(placed) | set(queued)):
        waiting = queued.get(key, empty)
        entry = out.setdefault(key, {"jobs": 0, "p50_s": None, "p95_s": None, "mean_s": None})
        entry["queued_at_end"] = len(waiting)
        mine = ordered.get(key)
        ranks = mine if mine is not None else Ranks([])  # all of this size still queued
        entry["p95_incl_queued_s"] = ranks.percentile(95, waiting)
    return dict(sorted(out.items()))


def _groups(
    groups: Mapping[str, list[Wait]], distinct: Waits, ordered: dict[str, Ranks] | None = None
) -> dict[str, dict[str, Any]]:
    """Jobs, p50, p95 and mean wait per group; each group's waits in order into ``ordered``
    when given (``_by_size`` reads them again)."""
    out: dict[str, dict[str, Any]] = {}
    for key, values in sorted(groups.items()):
        own = distinct.ranks(values)
        if ordered is not None:
            ordered[key] = own
        p50, p95 = own.percentile(50), own.percentile(95)
        out[key] = {"jobs": len(values), "p50_s": p50, "p95_s": p95, "mean_s": mean(values)}
    return out
