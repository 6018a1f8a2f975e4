"""What the simulator replays: a cluster, its teams, a stream of jobs, and settings.

A ``Scenario`` is built by the loaders (``corral.sim.loaders`` for YAML/JSON,
``corral.sim.traces`` for CSV/JSONL) or by the generators
(``corral.sim.generate``). Jobs are a *stream*: ``Scenario.jobs()`` returns a
fresh iterator each call, so a 1,000,000-job trace is read row by row and
never held in memory, and a benchmark can replay the same trace through
several policies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from corral.autoscaler import Config as AutoscaleConfig
from corral.autoscaler import Pool
from corral.core.compiled import mypyc_attr
from corral.core.model import Job, Node, Team
from corral.scheduler.api import Config


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
@dataclass(frozen=True, slots=True, init=False)
class SimJob:
    """One job of a trace: the job as submitted, and how much work it is.

    ``duration`` is seconds of running time; ``None`` runs until the end of the
    simulation. ``where`` says where the job was read (``line 12``), for
    errors found later (a duplicate id).
    """

    job: Job
    duration: float | None
    where: str = ""

    def __init__(self, job: Job, duration: float | None, where: str = "") -> None:
        # Written out, as ``Job``'s is: one is made per job of a trace.
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "duration", duration)
        object.__setattr__(self, "where", where)

    @property
    def submit_at(self) -> float:
        return self.job.submitted_at


DEFAULT_TICK_S = 15.0  # the server's default autoscale.tick_s
DEFAULT_BOOT_S = 60.0  # launch to join: a cloud VM's boot and its agent's start


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """How the simulated autoscaler runs (``scaling.py``): the pure autoscaler's hysteresis
    (``config``), how often it decides (``tick_s``) and how long a launched machine takes
    to join as a node (``boot_s``)."""

    config: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    tick_s: float = DEFAULT_TICK_S
    boot_s: float = DEFAULT_BOOT_S


@dataclass(frozen=True, slots=True)
class Scenario:
    """A cluster, its teams and a job stream, with the simulation's settings.

    ``until``: stop at this simulated time (None: when nothing more can happen).
    ``cycle_interval_s``: 0 runs a scheduling cycle at every instant where
    something changed; a positive value runs cycles only at multiples of it,
    as a server whose scheduling loop ticks at that period.
    ``fragmentation_sample_s``: measure fragmentation after a cycle at most
    this often (simulated seconds); 0 measures after every cycle.
    ``auto_teams``: a job naming a team that ``teams`` lacks gets a team
    without quota (True when the scenario declares no teams).
    ``pools``: machines the simulated autoscaler may launch (none: a fixed
    cluster, and the run does no autoscaling work at all), run as
    ``autoscaling`` says.
    """

    nodes: tuple[Node, ...]
    jobs: Callable[[], Iterator[SimJob]]
    teams: tuple[Team, ...] = ()
    config: Config = field(default_factory=Config)
    until: float | None = None
    seed: int = 0
    cycle_interval_s: float = 0.0
    fragmentation_sample_s: float = 60.0
    auto_teams: bool = True
    name: str = ""
    pools: tuple[Pool, ...] = ()
    autoscaling: Autoscaling = field(default_factory=Autoscaling)

    @property
    def total_gpus(self) -> int:
        """GPUs of the fixed nodes (``nodes``; autoscaled ones come and go)."""
        return sum(len(n.gpus) for n in self.nodes)


def fixed_jobs(jobs: tuple[SimJob, ...]) -> Callable[[], Iterator[SimJob]]:
    """A job stream over jobs already in memory (small scenarios, tests)."""

    def stream() -> Iterator[SimJob]:
        return iter(jobs)

    return stream
