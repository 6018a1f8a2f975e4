"""The vocabulary of DESIGN.md section 3 as frozen dataclasses and enums.

``*Spec`` is intent, ``*Status`` observation, ``*Snapshot`` a frozen view.
Everything here is immutable: the scheduler reads it, shells build new
values with ``dataclasses.replace`` when state changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from corral.core.compiled import mypyc_attr
from corral.core.errors import InvalidSpec
from corral.core.resources import ResourceRequest
from corral.core.states import AllocDesired, AllocObserved, JobState, NodeState

DEFAULT_TEAM: Final = "default"
"""Jobs without a team land here; it has no guaranteed quota."""

EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})

NO_RESOURCES: Final = ResourceRequest()
"""A job's default request (one CPU); frozen, so every job without one shares it."""
# The states of an active allocation (``Allocation.active``)
_PENDING: Final = AllocObserved.PENDING
_READY: Final = AllocObserved.READY
_RUNNING: Final = AllocObserved.RUNNING


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
    # May evict other teams' work of lower classes, only what they borrow beyond their quota
    # (a paid surge takes back lent capacity without waiting; never a team's guarantee).
    preempt_other_teams: bool = False


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
    temperature_c: float | None = None  # observed, degrees Celsius, for display
    numa: int = -1  # its NUMA node; -1: unknown
    links: tuple[str, ...] = ()  # its link to each GPU by index (core/topology.py), "" itself


@dataclass(frozen=True, slots=True)
class Node:
    """A machine running an agent, as the scheduler sees it."""

    name: str
    gpus: tuple[Gpu, ...] = ()
    cpus: float = 0  # CPU slots, to a milli-CPU (``resources.parse_cpus``)
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    models_on_disk: frozenset[str] = frozenset()
    models_loaded: frozenset[str] = frozenset()  # in a backend's VRAM right now
    backends: frozenset[str] = frozenset()  # executors it offers: "a1111", "comfyui", ...
    state: NodeState = NodeState.READY
    paused: bool = False  # no new work; running work continues
    draining: bool = False  # no new work; becomes removable when empty
    last_seen: float = 0.0
    # CPU slots of each NUMA node, ``(numa node, slots)`` by node, summing to ``cpus``; empty:
    # not reported (the node's CPUs are one pool). A GPU job's CPUs come from its GPUs' NUMA
    # nodes (docs/scheduler.md "CPUs from the GPUs' NUMA node").
    numa_cpus: tuple[tuple[int, float], ...] = ()
    # Host memory jobs may request, in bytes (the agent's RAM less its reserve); 0: none
    # reported, so a job asking for memory does not fit here.
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", frozen_map(self.labels))

    @property
    def schedulable(self) -> bool:
        return takes_work(self.state, paused=self.paused, draining=self.draining)


NODE_NAME_LABEL: Final = "corral/node"
"""Every node's own name, as a label the scheduler sees (as Kubernetes'
``kubernetes.io/hostname``): a job selecting it runs on that node only (a pipeline's
step held near its inputs, services/dependencies.py)."""


def named(node: Node) -> Node:
    """``node`` with its name among its labels (``NODE_NAME_LABEL``)."""
    if node.labels.get(NODE_NAME_LABEL) == node.name:
        return node
    return replace(node, labels={**node.labels, NODE_NAME_LABEL: node.name})


def takes_work(state: NodeState, *, paused: bool, draining: bool) -> bool:
    """Whether a node in ``state`` with these flags is given new work (``Node.schedulable``)."""
    return state is NodeState.READY and not paused and not draining


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
class InputFile:
    """A file a job reads: an uploaded blob (``POST /v1/inputs``) and the name the job's
    payload calls it by (a ComfyUI graph's ``LoadImage`` image, an A1111 init image)."""

    name: str
    sha256: str


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
@dataclass(frozen=True, slots=True, init=False)
class Job:
    """What a client submitted, with its current lifecycle state.

    The ``__init__`` is written out, not generated (same signature, same checks): the
    simulator makes one per job, and compiled this one is some 20x cheaper.
    """

    id: str
    resources: ResourceRequest = NO_RESOURCES
    kind: JobKind = JobKind.CUSTOM
    priority: str = "free"
    team: str = DEFAULT_TEAM
    user: str = "anonymous"
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    replicas: int = 1  # > 1: a gang, placed all or nothing
    gang_label: str | None = None  # prefer replicas on nodes sharing this label's value
    gang_label_required: bool = False  # ... or only on such nodes
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
    # Nodes where earlier attempts failed: a retry goes elsewhere when it fits elsewhere now.
    avoid_nodes: frozenset[str] = frozenset()
    # Further models it names (LoRAs, a VAE ...), spelled as inventories are (model_names.py):
    # nodes that have them all are preferred.
    models: frozenset[str] = frozenset()
    # Nodes whose backend refused it for a model they lack: it is never placed there again.
    lacking_nodes: frozenset[str] = frozenset()
    inputs: tuple[InputFile, ...] = ()  # uploaded files the agent hands its executor

    def __init__(  # noqa: PLR0913 (the dataclass's fields, as the generated one takes them)
        self,
        id: str,
        resources: ResourceRequest = NO_RESOURCES,
        kind: JobKind = JobKind.CUSTOM,
        priority: str = "free",
        team: str = DEFAULT_TEAM,
        user: str = "anonymous",
        node_selector: Mapping[str, str] = EMPTY,
        replicas: int = 1,
        gang_label: str | None = None,
        gang_label_required: bool = False,
        model: str | None = None,
        backend: str | None = None,
        batch_key: str | None = None,
        preemptible: bool = True,
        payload: Mapping[str, Any] = EMPTY,
        timeout_s: float | None = None,
        max_attempts: int = 3,
        idempotency_key: str | None = None,
        submitted_at: float = 0.0,
        not_before: float = 0.0,
        estimated_runtime_s: float | None = None,
        state: JobState = JobState.QUEUED,
        attempt: int = 0,
        avoid_nodes: frozenset[str] = frozenset(),
        models: frozenset[str] = frozenset(),
        lacking_nodes: frozenset[str] = frozenset(),
        inputs: tuple[InputFile, ...] = (),
    ) -> None:
        if not id:
            raise InvalidSpec("id", "must not be empty")
        if replicas < 1:
            raise InvalidSpec("replicas", f"must be >= 1, got {replicas}")
        if max_attempts < 1:
            raise InvalidSpec("max_attempts", "must be >= 1")
        if timeout_s is not None and timeout_s <= 0:
            raise InvalidSpec("timeout_s", "must be > 0")
        # Freeze the mappings (the defaults, EMPTY, are frozen already: most jobs skip this).
        if node_selector is not EMPTY:
            node_selector = frozen_map(node_selector)
        if payload is not EMPTY:
            payload = frozen_map(payload)
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "resources", resources)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "team", team)
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "node_selector", node_selector)
        object.__setattr__(self, "replicas", replicas)
        object.__setattr__(self, "gang_label", gang_label)
        object.__setattr__(self, "gang_label_required", gang_label_required)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "batch_key", batch_key)
        object.__setattr__(self, "preemptible", preemptible)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "timeout_s", timeout_s)
        object.__setattr__(self, "max_attempts", max_attempts)
        object.__setattr__(self, "idempotency_key", idempotency_key)
        object.__setattr__(self, "submitted_at", submitted_at)
        object.__setattr__(self, "not_before", not_before)
        object.__setattr__(self, "estimated_runtime_s", estimated_runtime_s)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "avoid_nodes", avoid_nodes)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "lacking_nodes", lacking_nodes)
        object.__setattr__(self, "inputs", inputs)

    @property
    def gang(self) -> bool:
        return self.replicas > 1


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
@dataclass(frozen=True, slots=True, init=False)
class Allocation:
    """One attempt of a job (or of a batch of sample jobs) on a node.

    ``desired`` is the server's intent, ``observed`` what the agent reported.
    A gang has one allocation per replica, all with the same ``job_ids``.
    ``__init__`` is written out, as ``Job``'s is (one is made per placement).
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
    cpus: float = 0  # to a milli-CPU
    on_cpu: bool = False  # CPU offload of a GPU job
    memory_bytes: int = 0  # host memory it holds on the node
    preemptible: bool = True
    borrowed: bool = False  # runs on capacity beyond its team's quota
    attempt: int = 1
    started_at: float = 0.0
    last_checkpoint_at: float | None = None
    progress: float = 0.0
    desired: AllocDesired = AllocDesired.RUN
    observed: AllocObserved = AllocObserved.PENDING

    def __init__(  # noqa: PLR0913 (the dataclass's fields, as the generated one takes them)
        self,
        id: str,
        job_ids: tuple[str, ...],
        node: str,
        team: str = DEFAULT_TEAM,
        user: str = "anonymous",
        priority: str = "free",
        replica: int = 0,
        gpu_indices: tuple[int, ...] = (),
        gpu_milli: int = 0,
        vram_bytes: int = 0,
        cpus: float = 0,
        on_cpu: bool = False,
        memory_bytes: int = 0,
        preemptible: bool = True,
        borrowed: bool = False,
        attempt: int = 1,
        started_at: float = 0.0,
        last_checkpoint_at: float | None = None,
        progress: float = 0.0,
        desired: AllocDesired = AllocDesired.RUN,
        observed: AllocObserved = AllocObserved.PENDING,
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "job_ids", job_ids)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "team", team)
        object.__setattr__(self, "user", user)
        object.__setattr__(self, "priority", priority)
        object.__setattr__(self, "replica", replica)
        object.__setattr__(self, "gpu_indices", gpu_indices)
        object.__setattr__(self, "gpu_milli", gpu_milli)
        object.__setattr__(self, "vram_bytes", vram_bytes)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "on_cpu", on_cpu)
        object.__setattr__(self, "memory_bytes", memory_bytes)
        object.__setattr__(self, "preemptible", preemptible)
        object.__setattr__(self, "borrowed", borrowed)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "started_at", started_at)
        object.__setattr__(self, "last_checkpoint_at", last_checkpoint_at)
        object.__setattr__(self, "progress", progress)
        object.__setattr__(self, "desired", desired)
        object.__setattr__(self, "observed", observed)

    @property
    def active(self) -> bool:
        """Holds resources: wanted or still running."""
        observed = self.observed
        return observed is _PENDING or observed is _RUNNING or observed is _READY

    @property
    def milli(self) -> int:
        return self.gpu_milli * len(self.gpu_indices)
