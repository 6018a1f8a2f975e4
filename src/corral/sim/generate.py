"""Seeded synthetic clusters and traces, for benchmarks and tests.

The trace imitates published GPU cluster traces (Microsoft Philly, Alibaba
PAI) in shape: mostly 1-GPU jobs, a tail of 2/4/8-GPU jobs and a few 2x8
gangs, some shared-GPU (half a card) jobs, log-normal run times (median 10
minutes), Poisson arrivals at a rate that offers ``load`` x the cluster's
GPUs on average, swinging over a day so that busy hours queue, and users'
run-time estimates of 1-2x the true run time. Times are whole seconds, as in
those traces. The same seed gives the same trace, job for job, and the trace is
produced as a stream.

Over 400 lines on purpose: the shape, the draws (here or by a forked drawer, packed
through a pipe) and the jobs made of them are one pipeline, each step feeding the next.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import itertools
import math
import os
import random
import signal
import struct
import sys
import threading
import traceback
from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Final, NoReturn

from corral.core.model import Gpu, Job, Node, Team
from corral.core.resources import GIB, MILLI, ResourceRequest
from corral.sim.scenario import Scenario, SimJob

if TYPE_CHECKING:
    from mypy_extensions import i64

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
_DIGITS: Final = tuple(f"{k:03d}" for k in range(1000))  # a job id's last three digits
CHUNK: Final = 8192  # jobs drawn at a time (``Columns``): a forked drawer's unit of work
PIPE_BYTES: Final = 1 << 20  # the drawer's pipe and the reader's buffer


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


def trace(shape: TraceShape, *, ahead: bool = False) -> Iterator[SimJob]:
    """A stream of ``shape.jobs`` jobs, sorted by submission time.

    ``ahead``: the numbers are drawn by a forked process, a chunk ahead of the jobs made
    from them here (``_ahead``), where the platform forks and the machine has a second
    core; else they are drawn here. Either way the jobs are the same, made by one builder
    from the same columns of draws."""
    if ahead and hasattr(os, "fork") and (os.cpu_count() or 1) > 1:
        return _jobs(shape, _ahead(shape))
    return _jobs(shape, _here(shape))


class Columns:
    """A chunk of a trace's draws, a list per field (job ``i`` is everyone's ``[i]``):
    submission time, kind (``SHAPES``), user, class (``PRIORITY_MIX``), run time, and the
    user's estimate (NaN: none)."""

    __slots__ = ("cls", "estimate", "kind", "run", "submit", "user")

    def __init__(self) -> None:
        self.submit: list[float] = []
        self.kind: list[int] = []
        self.user: list[int] = []
        self.cls: list[int] = []
        self.run: list[float] = []
        self.estimate: list[float] = []


class _Drawer:
    """A trace's random draws (``draw`` a chunk at a time), in the order ``trace`` always
    drew them: arrival (with thinning), kind, user, run time, class; estimates from their
    own stream."""

    def __init__(self, shape: TraceShape) -> None:
        self.rand = random.Random(shape.seed).random
        self.rate = shape.load * shape.total_gpus / (_mean_gpus() * _mean_run_s())
        self.kind_cdf = list(itertools.accumulate(w for _, _, w in SHAPES))
        self.class_cdf = list(itertools.accumulate(w for _, w in PRIORITY_MIX))
        self.mu = math.log(MEDIAN_RUN_S)
        self.swing, self.users = shape.daily_swing, shape.users
        self.peak = self.rate * (1 + shape.daily_swing)
        # users' estimates, drawn from their own stream: 60 s x ceil(run x uniform(low,
        # high) / 60)
        self.guess = None if shape.estimates is None else _estimates_rand(shape)
        self.low, high = shape.estimates or (0.0, 0.0)
        self.span = high - self.low  # Random.uniform(low, high) is low + (high - low) * random()
        self.clock = 0.0

    def draw(self, count: int) -> Columns:
        rand, peak, rate, swing, day_rad = self.rand, self.peak, self.rate, self.swing, _DAY_RAD
        kind_cdf, class_cdf, users, mu = self.kind_cdf, self.class_cdf, self.users, self.mu
        guess, low, span, clock = self.guess, self.low, self.span, self.clock
        out = Columns()
        for _ in range(count):
            clock += expovariate(rand, peak)
            while rand() * peak > rate * (1 + swing * math.sin(clock * day_rad)):
                clock += expovariate(rand, peak)  # thinning: fewer arrivals at night
            out.kind.append(bisect.bisect(kind_cdf, rand() * kind_cdf[-1]))
            out.user.append(int(rand() * users))
            run_s = min(MAX_RUN_S, max(1.0, round(lognormvariate(rand, mu, RUN_SIGMA))))
            out.run.append(run_s)
            out.cls.append(bisect.bisect(class_cdf, rand() * class_cdf[-1]))
            out.submit.append(float(round(clock)))
            out.estimate.append(
                math.nan
                if guess is None
                else 60.0 * math.ceil(run_s * (low + span * guess()) / 60.0)
            )
        self.clock = clock
        return out


def _here(shape: TraceShape) -> Generator[Columns, None, None]:
    """The trace's draws, drawn in this process a chunk at a time."""
    drawer, left = _Drawer(shape), shape.jobs
    while left > 0:
        count = min(CHUNK, left)
        yield drawer.draw(count)
        left -= count


def _ahead(shape: TraceShape) -> Generator[Columns, None, None]:
    """The trace's draws from a forked process (``_drawer_main``), a chunk or so ahead.

    Drawing is 5-8% of a compiled run's time at 1,000,000 jobs, which a second core takes off
    it; making the jobs stays here (a ``Job`` does not cross a pipe cheaply). The drawer
    writes each chunk as one packed record (``_pack``) and blocks while the pipe is full.
    A drawer that stops short is an error here; a consumer that stops early (a run's
    ``until``) ends it."""
    if threading.active_count() > 1:  # forking a process with threads is not safe
        yield from _here(shape)
        return
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # Linux: room for a few chunks
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    pid = os.fork()
    if pid == 0:  # the drawer: never returns
        os.close(read_fd)
        _drawer_main(shape, write_fd)
    os.close(write_fd)
    pipe = os.fdopen(read_fd, "rb", buffering=PIPE_BYTES)
    done = False
    try:
        left = shape.jobs
        while left > 0:
            chunk = _unpack(pipe)
            if chunk is None:
                raise RuntimeError(f"the trace's drawer (pid {pid}) stopped {left} jobs short")
            left -= len(chunk.submit)
            yield chunk
        done = True
    finally:
        pipe.close()
        if not done:  # stopped early, or failed: the drawer may still be writing
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _drawer_main(shape: TraceShape, fd: int) -> NoReturn:
    """A forked drawer's whole life: write every chunk of draws to ``fd``, then exit."""
    code = 0
    try:
        for chunk in _here(shape):  # the chunks the trace would draw in process
            view = memoryview(_pack(chunk))
            while len(view):
                written = os.write(fd, view)
                view = view[written:]
    except BrokenPipeError:
        code = 1  # the consumer stopped reading
    except BaseException:  # reported here; the consumer sees the trace stop short
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)  # no cleanup of the parent's state: this is a copy of it


# A chunk's record on the pipe (``_pack``, ``_unpack``): its job count, then each column's
# values, 8 bytes each, in this order and of these ``array`` type codes.
_LAYOUT: Final = (
    ("submit", "d"),
    ("run", "d"),
    ("estimate", "d"),
    ("kind", "q"),
    ("user", "q"),
    ("cls", "q"),
)


def _pack(chunk: Columns) -> bytes:
    """``chunk`` as one record (``_LAYOUT``)."""
    parts = [struct.pack("<q", len(chunk.submit))]
    for name, code in _LAYOUT:
        parts.append(array(code, getattr(chunk, name)).tobytes())
    return b"".join(parts)


def _unpack(pipe: IO[bytes]) -> Columns | None:
    """The next record ``_pack`` wrote to ``pipe`` (None: the stream ended)."""
    head = pipe.read(8)
    if len(head) < 8:
        return None
    width = 8 * int(struct.unpack("<q", head)[0])
    body = pipe.read(len(_LAYOUT) * width)
    if len(body) < len(_LAYOUT) * width:
        return None
    chunk = Columns()
    for k, (name, code) in enumerate(_LAYOUT):
        values = array(code)
        values.frombytes(body[k * width : (k + 1) * width])
        setattr(chunk, name, values.tolist())
    return chunk


def _jobs(shape: TraceShape, chunks: Generator[Columns, None, None]) -> Iterator[SimJob]:
    """The jobs of ``chunks`` of draws: ``g1``, ``g2``, ... sharing one request per kind.
    Closing this stream closes ``chunks`` (a drawer ahead ends with it), explicitly: a
    generator dropped unclosed need not run its ``finally``."""
    try:
        yield from _made(shape, chunks)
    finally:
        chunks.close()


def _made(shape: TraceShape, chunks: Iterator[Columns]) -> Iterator[SimJob]:
    kinds = [(_request(g), r) for g, r, _ in SHAPES]
    classes = [name for name, _ in PRIORITY_MIX]
    users = [(sys.intern(f"user-{u}"), team_name(u % shape.teams)) for u in range(shape.users)]
    # A job's id ``g{n}`` as ``g{n // 1000}`` (made once a thousand jobs) joined to the last
    # three digits (made once): ids are made per job, on the simulator's path
    high: i64 = 0
    low: i64 = 0
    head = "g"
    for chunk in chunks:
        submit, kind, user, cls, run, estimate = (
            chunk.submit,
            chunk.kind,
            chunk.user,
            chunk.cls,
            chunk.run,
            chunk.estimate,
        )
        for i in range(len(submit)):
            low += 1
            if low == 1000:
                high, low = high + 1, 0
                head = f"g{high}"
            job_id = head + _DIGITS[low] if high else f"g{low}"
            request, replicas = kinds[kind[i]]
            name, team = users[user[i]]
            guessed = estimate[i]
            job = Job(
                id=job_id,
                resources=request,
                priority=classes[cls[i]],
                team=team,
                user=name,
                replicas=replicas,
                submitted_at=submit[i],
                estimated_runtime_s=None if math.isnan(guessed) else guessed,
            )
            # Whole seconds, as drawn: an int between the bounds (``min``/``max`` gave
            # the rounded draw), else the bound's float, so a written trace says "765"
            run_s = run[i]
            yield SimJob(job, int(run_s) if 1.0 < run_s < MAX_RUN_S else run_s, "generated")


def expovariate(rand: Callable[[], float], rate: float) -> float:
    """``random.Random.expovariate(rate)`` drawn from ``rand`` (its ``random``): the same
    formula, so the same value. Here, so that the drawer compiles it: with ``random``'s
    interpreted methods the drawer fell behind the compiled simulator it feeds (tests
    check that both agree)."""
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
    ahead: bool = False,
) -> Scenario:
    """A generated cluster with four equal-quota teams and a generated trace (``ahead``:
    drawn by a forked process, ``trace``)."""
    machines = cluster(nodes, gpus_per_node)
    shape = TraceShape(jobs=jobs, total_gpus=nodes * gpus_per_node, load=load, seed=seed)
    return Scenario(
        nodes=machines,
        jobs=lambda: trace(shape, ahead=ahead),
        teams=teams(shape.teams, shape.total_gpus),
        seed=seed,
        cycle_interval_s=cycle_interval_s,
        fragmentation_sample_s=fragmentation_sample_s,
        auto_teams=False,
        name=f"generated {nodes} nodes x {jobs} jobs (load {load:g}, seed {seed})",
    )


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
