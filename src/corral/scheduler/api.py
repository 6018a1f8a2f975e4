"""The scheduler's contract: ``schedule(snapshot, config, now, seed) -> Plan``.

Pure: no I/O, no clock reads, no global random, no asyncio. The server and
the simulator both call it; every behaviour is testable in microseconds.

This module holds the types only; ``corral.scheduler.pipeline`` implements
``schedule`` (re-exported by ``corral.scheduler``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from corral.core.compiled import mypyc_attr
from corral.core.errors import InvalidSpec
from corral.core.model import (
    DEFAULT_PRIORITY_CLASSES,
    EMPTY,
    Allocation,
    Job,
    Node,
    PriorityClass,
    Team,
    frozen_map,
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A frozen view of what the scheduler decides about.

    ``queued`` are jobs in state ``queued`` (some may wait for ``not_before``);
    ``allocations`` are the active ones (they hold resources on their nodes).
    ``expected_ends`` (optional) maps allocation ids to when they should end
    (start + estimated run time), for end-together placement. ``model_sizes``
    (optional) gives registered models' sizes, for model-aware routing.
    ``served`` (optional) is each user's recent service from the shell's
    ``scheduler.served.ServiceLedger``, so fair mixing carries across cycles.
    """

    nodes: tuple[Node, ...] = ()
    queued: tuple[Job, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    teams: tuple[Team, ...] = ()
    expected_ends: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    model_sizes: Mapping[str, int] = field(default_factory=lambda: EMPTY)  # registry name -> bytes
    served: Mapping[str, float] = field(default_factory=lambda: EMPTY)  # user -> recent service

    def __post_init__(self) -> None:
        object.__setattr__(self, "expected_ends", frozen_map(self.expected_ends))
        object.__setattr__(self, "model_sizes", frozen_map(self.model_sizes))
        object.__setattr__(self, "served", frozen_map(self.served))


@dataclass(frozen=True, slots=True)
class Config:
    """Policy knobs. Defaults are what a home user wants without reading docs."""

    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    user_weights: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    max_batch_size: int = 8  # sample jobs coalesced into one allocation, at most
    preemption: bool = True
    min_runtime_before_preemption_s: float = 60.0  # do not thrash work that just began
    max_placements_per_cycle: int | None = None  # None: as many as fit
    # Added by the scheduler (all optional, defaults keep the contract above):
    candidates_per_tier: int = 2  # fits scored per locality level: bounded search, O(log) cost
    scorer_weights: Mapping[str, float] = field(default_factory=lambda: EMPTY)  # by scorer name
    # Model-aware routing (routing.py): with a fetch rate, a job may wait for a node that has
    # its model instead of fetching it elsewhere, when that is expected to be quicker.
    model_fetch_bytes_per_s: float | None = None  # None: never wait for a model
    model_load_bytes_per_s: float = 1e9  # disk to GPU memory
    model_max_wait_s: float = 300.0  # a job never waits for a model holder past this age
    # Backfill reservations (reservation.py): the first job of each class asking for at least
    # this many whole GPUs (all replicas) that cannot be placed gets the nodes that free up
    # first; later jobs use them only if their run-time estimate ends before. None: off.
    reserve_min_gpus: int | None = 8
    reservations: int = 1  # big jobs at the head of each class (and pass) that get one
    # Consolidation (consolidation.py): running allocations moved per cycle at most, to other
    # nodes where they fit now, when that lets a waiting job run. 0: never; none either
    # with preemption off (a move stops running work as a preemption does).
    consolidation_moves: int = 4
    # Small jobs first (passes.py): inside a class, jobs smaller than reserve_min_gpus are
    # placed before big ones, except big jobs that have waited at least this many times as
    # long as the class's oldest small job still waiting: those go first and reserve nodes.
    # 2.0: on the simulator's standard run (bench/sim.py --full: 1,000 nodes, a million
    # jobs, saturated daily peaks) it keeps every small size under first and best fit's p95
    # wait and the big jobs under first fit's (docs/sim.md). None: one fair order.
    big_wait_ratio: float | None = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_weights", frozen_map(self.user_weights))
        object.__setattr__(self, "scorer_weights", frozen_map(self.scorer_weights))
        _check_config(self)


def _check_config(config: Config) -> None:
    """Refuse a config that cannot work, naming the field."""
    names = [c.name for c in config.priority_classes]
    if len(set(names)) != len(names):
        raise InvalidSpec("config.priority_classes", f"duplicate class names in {names}")
    if config.max_batch_size < 1:
        raise InvalidSpec("config.max_batch_size", "must be >= 1")
    if config.min_runtime_before_preemption_s < 0:
        raise InvalidSpec("config.min_runtime_before_preemption_s", "must be >= 0")
    if config.max_placements_per_cycle is not None and config.max_placements_per_cycle < 0:
        raise InvalidSpec("config.max_placements_per_cycle", "must be >= 0 or None")
    if config.candidates_per_tier < 1:
        raise InvalidSpec("config.candidates_per_tier", "must be >= 1")
    fetch = config.model_fetch_bytes_per_s
    if fetch is not None and fetch <= 0:
        raise InvalidSpec("config.model_fetch_bytes_per_s", "must be > 0 or None")
    if config.model_load_bytes_per_s <= 0:
        raise InvalidSpec("config.model_load_bytes_per_s", "must be > 0")
    _check_reservations(config)
    if config.model_max_wait_s < 0:
        raise InvalidSpec("config.model_max_wait_s", "must be >= 0")
    for user, weight in config.user_weights.items():
        if weight <= 0:
            raise InvalidSpec(f"config.user_weights.{user}", "must be > 0")


def _check_reservations(config: Config) -> None:
    if config.reservations < 0:
        raise InvalidSpec("config.reservations", "must be >= 0")
    if config.consolidation_moves < 0:
        raise InvalidSpec("config.consolidation_moves", "must be >= 0")
    if config.reserve_min_gpus is not None and config.reserve_min_gpus < 1:
        raise InvalidSpec("config.reserve_min_gpus", "must be >= 1 or None")
    ratio = config.big_wait_ratio
    if ratio is not None and not (ratio > 0 and math.isfinite(ratio)):
        raise InvalidSpec("config.big_wait_ratio", "must be a finite number > 0 or None")


class Remedy(StrEnum):
    """What could let an unplaced job run."""

    WAIT = "wait"  # capacity exists in the cluster; it is busy now
    PREEMPT = "preempt"  # evicting lower-priority or borrowed work would make room
    NONE = "none"  # no node could ever run it as it is (unresolvable)


class ReasonCode(StrEnum):
    NODE_NOT_READY = "node_not_ready"  # lost
    NODE_PAUSED = "node_paused"
    NODE_DRAINING = "node_draining"
    SELECTOR_MISMATCH = "selector_mismatch"
    GPU_MODEL_MISMATCH = "gpu_model_mismatch"
    BACKEND_MISSING = "backend_missing"
    TOO_FEW_GPUS = "too_few_gpus"  # the node has fewer GPUs than asked, ever
    INSUFFICIENT_GPUS = "insufficient_gpus"  # not enough free right now
    INSUFFICIENT_VRAM = "insufficient_vram"
    INSUFFICIENT_CPUS = "insufficient_cpus"
    # the node has the CPUs, but not on the NUMA nodes of the GPUs it could give
    INSUFFICIENT_NUMA_CPUS = "insufficient_numa_cpus"
    INSUFFICIENT_MEMORY = "insufficient_memory"  # host memory, on the node or free on it
    MODEL_MISSING = "model_missing"  # informational: will be downloaded
    MODEL_WAIT = "model_wait"  # waits for a node with its model: quicker than fetching it
    QUOTA_EXCEEDED = "quota_exceeded"  # team at quota + borrow limit
    GANG_INCOMPLETE = "gang_incomplete"  # not all replicas fit at once
    NOT_BEFORE = "not_before"  # retry backoff not yet over
    CYCLE_LIMIT = "cycle_limit"  # max placements per cycle reached
    RESERVED = "reserved"  # the node is reserved for a bigger job ahead in the queue
    HOLDS_RESERVATION = "holds_reservation"  # informational: nodes are reserved for this job
    MIN_RUNTIME = "min_runtime"  # informational: when the work it would evict may be evicted
    UNKNOWN_PRIORITY = "unknown_priority"
    HELD = "held"  # a client holds it: never placed until released
    # informational: placed, it waits for the work it evicts or moves to stop (a server's)
    MAKING_ROOM = "making_room"


@dataclass(frozen=True, slots=True)
class Reason:
    """``nodes`` nodes ruled the job out for ``code``."""

    code: ReasonCode
    nodes: int
    message: str


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
@dataclass(frozen=True, slots=True, init=False)
class Placement:
    """Run ``job_ids`` (one job, or a batch of sample jobs) on ``node``.

    ``__init__`` is written out, as ``Job``'s is (one is made per placement).
    """

    allocation_id: str
    job_ids: tuple[str, ...]
    node: str
    replica: int = 0
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0  # per listed GPU
    vram_bytes: int = 0  # reserved per listed GPU
    cpus: float = 0  # to a milli-CPU
    on_cpu: bool = False
    memory_bytes: int = 0  # host memory
    borrowed: bool = False
    preempts: tuple[str, ...] = ()  # allocation ids that must stop before this one starts

    def __init__(  # noqa: PLR0913 (the dataclass's fields, as the generated one takes them)
        self,
        allocation_id: str,
        job_ids: tuple[str, ...],
        node: str,
        replica: int = 0,
        gpu_indices: tuple[int, ...] = (),
        gpu_milli: int = 0,
        vram_bytes: int = 0,
        cpus: float = 0,
        on_cpu: bool = False,
        memory_bytes: int = 0,
        borrowed: bool = False,
        preempts: tuple[str, ...] = (),
    ) -> None:
        object.__setattr__(self, "allocation_id", allocation_id)
        object.__setattr__(self, "job_ids", job_ids)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "gpu_indices", gpu_indices)
        object.__setattr__(self, "gpu_milli", gpu_milli)
        object.__setattr__(self, "vram_bytes", vram_bytes)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "on_cpu", on_cpu)
        object.__setattr__(self, "memory_bytes", memory_bytes)
        object.__setattr__(self, "borrowed", borrowed)
        object.__setattr__(self, "preempts", preempts)


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict ``allocation_id`` (with a grace period) to make room for ``for_job``.

    ``move_to``: a consolidation move, not a preemption: the job is requeued and fits on
    that node now (``consolidation.py``); empty for a preemption."""

    allocation_id: str
    job_ids: tuple[str, ...]
    node: str
    for_job: str
    reason: str
    move_to: str = ""


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A job left queued, at ``position`` in the order, with why and what could help."""

    job_id: str
    position: int
    reasons: tuple[Reason, ...]
    remedy: Remedy

    def summary(self) -> str:
        """``"4 nodes: insufficient VRAM; 1 node: paused"``."""
        return "; ".join(
            f"{r.nodes} node{'s' if r.nodes != 1 else ''}: {r.message}" if r.nodes else r.message
            for r in self.reasons
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision of one cycle. Appliers verify it against the latest state."""

    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    # (allocation id, borrowed): running allocations whose ``borrowed`` flag changes, so the
    # flags stay the fewest that cover each team's usage past its quota (``borrowing.py``)
    reflags: tuple[tuple[str, bool], ...] = ()

    @property
    def batches(self) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if len(p.job_ids) > 1)
