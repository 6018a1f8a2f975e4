"""Seeded synthetic clusters and traces, for benchmarks and tests.

The trace imitates published GPU cluster traces (Microsoft Philly, Alibaba
PAI) in shape: mostly 1-GPU jobs, a tail of 2/4/8-GPU jobs and a few 2x8
gangs, some shared-GPU (half a card) jobs, log-normal run times (median 10
minutes), Poisson arrivals at a rate that offers ``load`` x the cluster's
GPUs on average, swinging over a day so that busy hours queue, and users'
run-time estimates of 1-2x the true run time. Times are whole seconds, as in
those traces. The same seed gives the same trace, job
for job, and the trace is produced as a stream.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from corral.core.model import Gpu, Job, Node, Team
from corral.core.resources import GIB, MILLI, ResourceRequest
from corral.sim.scenario import Scenario, SimJob

SHAPES: tuple[tuple[float, int, float], ...] = (
    # (GPUs per replica, replicas, share of jobs)
    (0.5, 1, 0.05),
    (1, 1, 0.55),
    (2, 1, 0.15),
    (4, 1, 0.12),
    (8, 1, 0.10),
    (8, 2, 0.03),
)
PRIORITY_MIX = (("interactive", 0.05), ("paid", 0.25), ("free", 0.30), ("batch", 0.40))
MEDIAN_RUN_S: Final = 600.0  # log-normal run time: median 10 minutes ...
RUN_SIGMA: Final = 1.0  # ... mean about 16.5 minutes, a long tail
MAX_RUN_S: Final = 86_400.0  # one day
_DAY_RAD: Final = 2 * math.pi / 86_400.0
_NV_MAGIC: Final = 4 * math.exp(-0.5) / math.sqrt(2.0)  # random.NV_MAGICCONST


@dataclass(frozen=True, slots=True)
class TraceShape:
    """Knobs of a generated trace."""

    jobs: int
    total_gpus: int
    load: float = 0.9  # offered GPU demand / cluster GPUs, on average over a day
    daily_swing: float = 0.5  # arrival rate swings +-50% over a day (busy days, quiet nights)
    teams: int = 4
    users: int = 64
    seed: int = 0
    # Users' run-time estimates (``Job.estimated_runtime_s``, what Slurm calls a time limit):
    # the true run time times a factor drawn uniformly from this range, rounded up to a
    # minute. None: no estimates. Drawn from their own random stream, so the rest of the
    # trace is the same with or without them.
    estimates: tuple[float, float] | None = (1.0, 2.0)


def cluster(nodes: int, gpus_per_node: int = 8, *, model: str = "A100") -> tuple[Node, ...]:
    """``nodes`` identical nodes ``node-1`` ... with 8 CPUs per GPU, 4 nodes a rack."""
    cards = tuple(Gpu(i, model, 80 * GIB) for i in range(gpus_per_node))
    return tuple(
        Node(f"node-{i}", gpus=cards, cpus=8 * gpus_per_node, labels={"rack": f"r{i // 4}"})
        for i in range(1, nodes + 1)
    )


def teams(count: int, total_gpus: int) -> tuple[Team, ...]:
    """``count`` teams splitting the cluster's GPUs as equal quotas, free to borrow."""
    return tuple(Team(team_name(k), quota_gpus=total_gpus / count) for k in range(count))


def team_name(k: int) -> str:
    """Team ``k``'s name, interned: the trace's jobs and the scenario's ``Team`` then name
    it by one string object, and a map keyed by team finds it by identity (an equal but
    distinct string costs a compare of its characters on every look-up)."""
    return sys.intern(f"team-{k}")


def trace(shape: TraceShape) -> Iterator[SimJob]:
    """A stream of ``shape.jobs`` jobs, sorted by submission time."""
    rand = random.Random(shape.seed).random
    rate = shape.load * shape.total_gpus / (_mean_gpus() * _mean_run_s())
    kinds = [(_request(g), r) for g, r, _ in SHAPES]
    kind_cdf = list(itertools.accumulate(w for _, _, w in SHAPES))
    classes = [name for name, _ in PRIORITY_MIX]
    class_cdf = list(itertools.accumulate(w for _, w in PRIORITY_MIX))
    users = [(sys.intern(f"user-{u}"), team_name(u % shape.teams)) for u in range(shape.users)]
    mu = math.log(MEDIAN_RUN_S)
    # Read once, not per job: the shape's fields are attribute lookups and ``_DAY_RAD`` a
    # module global's in a compiled build.
    swing, user_count, day_rad = shape.daily_swing, shape.users, _DAY_RAD
    peak = rate * (1 + swing)
    # users' estimates, drawn from their own stream: 60 s x ceil(run x uniform(low, high) /
    # 60), written out here (a closure was a generic call per job)
    guess = None if shape.estimates is None else _estimates_rand(shape)
    low, high = shape.estimates or (0.0, 0.0)
    span = high - low  # random.Random.uniform(low, high) is low + (high - low) * random()
    clock = 0.0
    for n in range(1, shape.jobs + 1):
        clock += expovariate(rand, peak)
        while rand() * peak > rate * (1 + swing * math.sin(clock * day_rad)):
            clock += expovariate(rand, peak)  # thinning: fewer arrivals at night
        request, replicas = kinds[_pick(kind_cdf, rand() * kind_cdf[-1])]
        user, team = users[int(rand() * user_count)]
        run_s = min(MAX_RUN_S, max(1.0, _round(lognormvariate(rand, mu, RUN_SIGMA))))
        job = Job(
            id=f"g{n}",
            resources=request,
            priority=classes[_pick(class_cdf, rand() * class_cdf[-1])],
            team=team,
            user=user,
            replicas=replicas,
            submitted_at=float(_round(clock)),
            estimated_runtime_s=None
            if guess is None
            else 60.0 * math.ceil(run_s * (low + span * guess()) / 60.0),
        )
        yield SimJob(job, run_s, "generated")


def expovariate(rand: Callable[[], float], rate: float) -> float:
    """``random.Random.expovariate(rate)`` drawn from ``rand`` (its ``random``): the same
    formula, so the same value, without the interpreted method call (a compiled build
    compiles this one; tests check that both agree)."""
    return -math.log(1.0 - rand()) / rate


def lognormvariate(rand: Callable[[], float], mu: float, sigma: float) -> float:
    """``random.Random.lognormvariate(mu, sigma)`` drawn from ``rand``, as ``expovariate``:
    exp of a normal variate by Kinderman and Monahan's method, as ``random`` does it."""
    while True:
        u1 = rand()
        u2 = 1.0 - rand()
        z = _NV_MAGIC * (u1 - 0.5) / u2
        if z * z / 4.0 <= -math.log(u2):
            return math.exp(mu + z * sigma)


def scenario(
    nodes: int,
    jobs: int,
    *,
    gpus_per_node: int = 8,
    load: float = 0.9,
    seed: int = 0,
    cycle_interval_s: float = 0.0,
    fragmentation_sample_s: float = 60.0,
) -> Scenario:
    """A generated cluster with four equal-quota teams and a generated trace."""
    machines = cluster(nodes, gpus_per_node)
    shape = TraceShape(jobs=jobs, total_gpus=nodes * gpus_per_node, load=load, seed=seed)
    return Scenario(
        nodes=machines,
        jobs=lambda: trace(shape),
        teams=teams(shape.teams, shape.total_gpus),
        seed=seed,
        cycle_interval_s=cycle_interval_s,
        fragmentation_sample_s=fragmentation_sample_s,
        auto_teams=False,
        name=f"generated {nodes} nodes x {jobs} jobs (load {load:g}, seed {seed})",
    )


def _round(x: float) -> int:
    """``round(x)``: the nearest integer, ties to even. Written out: a compiled build calls
    ``round`` of a float through a generic lookup of its ``__round__`` method."""
    low = math.floor(x)
    rest = x - low  # exact: the fraction of x
    if rest > 0.5 or (rest == 0.5 and low % 2 == 1):
        low += 1
    return low


def _pick(cdf: list[float], x: float) -> int:
    """``bisect.bisect(cdf, x)``: the first position of the sorted ``cdf`` whose value is
    above ``x``. A loop over these short lists, which a compiled build runs inline, where
    ``bisect`` was a generic call comparing boxed floats."""
    at = 0
    while at < len(cdf) and cdf[at] <= x:
        at += 1
    return at


def _estimates_rand(shape: TraceShape) -> Callable[[], float]:
    """The random stream users' estimates are drawn from (see ``TraceShape.estimates``)."""
    return random.Random(f"estimates-{shape.seed}").random


def _request(gpus: float) -> ResourceRequest:
    if gpus < 1:
        return ResourceRequest(gpu_milli=round(gpus * MILLI), vram_bytes=20 * GIB, cpus=2)
    return ResourceRequest(gpus=int(gpus), cpus=4 * int(gpus))


def _mean_gpus() -> float:
    total = sum(w for _, _, w in SHAPES)
    return sum(g * r * w for g, r, w in SHAPES) / total


def _mean_run_s() -> float:
    """Mean of the log-normal run time (the cap at one day changes it negligibly)."""
    return MEDIAN_RUN_S * math.exp(RUN_SIGMA**2 / 2)
