"""The vocabulary of DESIGN.md section 3 as frozen dataclasses and enums.

``*Spec`` is intent, ``*Status`` observation, ``*Snapshot`` a frozen view.
Everything here is immutable: the scheduler reads it, shells build new
values with ``dataclasses.replace`` when state changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from corral.core.errors import InvalidSpec
from corral.core.resources import ResourceRequest
from corral.core.states import AllocDesired, AllocObserved, JobState, NodeState

DEFAULT_TEAM = "default"
"""Jobs without a team land here; it has no guaranteed quota."""

EMPTY: Mapping[str, Any] = MappingProxyType({})


def frozen_map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy, so a frozen dataclass cannot be changed through its mapping."""
    return MappingProxyType(dict(value)) if value else EMPTY


class JobKind(StrEnum):
    SAMPLE = "sample"  # an image/text generation request: short, batchable
    TRAIN = "train"  # a long run, usually a command, checkpoints, maybe a gang
    CUSTOM = "custom"  # anything else a handler understands


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named level. Higher ``rank`` is served first."""

    name: str
    rank: int
    can_preempt: bool = False  # may evict lower, preemptible classes of its own team
    preemptible: bool = True  # its allocations may be evicted
    cpu_offload: bool = False  # its jobs may run on CPU slots when no GPU is free


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("interactive", rank=40, can_preempt=True, preemptible=False),
    PriorityClass("paid", rank=30, can_preempt=True),
    PriorityClass("free", rank=20),
    PriorityClass("batch", rank=10, cpu_offload=True),
)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    model: str
    vram_bytes: int
    vram_free_bytes: int | None = None  # observed, for display; scheduling uses reservations
    utilization: float | None = None  # observed 0..1


@dataclass(frozen=True, slots=True)
class Node:
    """A machine running an agent, as the scheduler sees it."""

    name: str
    gpus: tuple[Gpu, ...] = ()
    cpus: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    models_on_disk: frozenset[str] = frozenset()
    models_loaded: frozenset[str] = frozenset()  # in a backend's VRAM right now
    backends: frozenset[str] = frozenset()  # executors it offers: "a1111", "comfyui", ...
    state: NodeState = NodeState.READY
    paused: bool = False  # no new work; running work continues
    draining: bool = False  # no new work; becomes removable when empty
    last_seen: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", frozen_map(self.labels))

    @property
    def schedulable(self) -> bool:
        return self.state is NodeState.READY and not self.paused and not self.draining


@dataclass(frozen=True, slots=True)
class Team:
    """Guaranteed GPUs (whole-GPU equivalents), how far it may borrow, its weight."""

    name: str
    quota_gpus: float = 0.0
    borrow_limit_gpus: float | None = None  # None: may borrow any idle capacity
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.quota_gpus < 0:
            raise InvalidSpec("quota_gpus", "must be >= 0")
        if self.borrow_limit_gpus is not None and self.borrow_limit_gpus < 0:
            raise InvalidSpec("borrow_limit_gpus", "must be >= 0")
        if self.weight <= 0:
            raise InvalidSpec("weight", "must be > 0")


@dataclass(frozen=True, slots=True)
class Job:
    """What a client submitted, with its current lifecycle state."""

    id: str
    resources: ResourceRequest = field(default_factory=ResourceRequest)
    kind: JobKind = JobKind.CUSTOM
    priority: str = "free"
    team: str = DEFAULT_TEAM
    user: str = "anonymous"
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    replicas: int = 1  # > 1: a gang, placed all or nothing
    gang_label: str | None = None  # prefer replicas on nodes sharing this label's value
    model: str | None = None  # registry name the job needs
    backend: str | None = None  # executor it needs ("a1111", "comfyui", "python", "command")
    batch_key: str | None = None  # equal keys may share one allocation (sample jobs)
    preemptible: bool = True
    payload: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    timeout_s: float | None = None
    max_attempts: int = 3
    idempotency_key: str | None = None
    submitted_at: float = 0.0
    not_before: float = 0.0  # retry backoff: not placeable before this time
    estimated_runtime_s: float | None = None
    state: JobState = JobState.QUEUED
    attempt: int = 0

    def __post_init__(self) -> None:
        if not self.id:
            raise InvalidSpec("id", "must not be empty")
        if self.replicas < 1:
            raise InvalidSpec("replicas", f"must be >= 1, got {self.replicas}")
        if self.max_attempts < 1:
            raise InvalidSpec("max_attempts", "must be >= 1")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise InvalidSpec("timeout_s", "must be > 0")
        # Freeze the mappings (the defaults, EMPTY, are frozen already: most jobs skip this).
        if self.node_selector is not EMPTY:
            object.__setattr__(self, "node_selector", frozen_map(self.node_selector))
        if self.payload is not EMPTY:
            object.__setattr__(self, "payload", frozen_map(self.payload))

    @property
    def gang(self) -> bool:
        return self.replicas > 1


_ACTIVE: Final = frozenset({AllocObserved.PENDING, AllocObserved.RUNNING})


@dataclass(frozen=True, slots=True)
class Allocation:
    """One attempt of a job (or of a batch of sample jobs) on a node.

    ``desired`` is the server's intent, ``observed`` what the agent reported.
    A gang has one allocation per replica, all with the same ``job_ids``.
    """

    id: str
    job_ids: tuple[str, ...]
    node: str
    team: str = DEFAULT_TEAM
    user: str = "anonymous"
    priority: str = "free"
    replica: int = 0
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0  # per listed GPU: 1000 for whole cards, the share for a shared card
    vram_bytes: int = 0  # reserved per listed GPU (shared cards)
    cpus: int = 0
    on_cpu: bool = False  # CPU offload of a GPU job
    preemptible: bool = True
    borrowed: bool = False  # runs on capacity beyond its team's quota
    attempt: int = 1
    started_at: float = 0.0
    last_checkpoint_at: float | None = None
    progress: float = 0.0
    desired: AllocDesired = AllocDesired.RUN
    observed: AllocObserved = AllocObserved.PENDING

    @property
    def active(self) -> bool:
        """Holds resources: wanted or still running."""
        return self.observed in _ACTIVE

    @property
    def milli(self) -> int:
        return self.gpu_milli * len(self.gpu_indices)
