"""What the store returns: the core vocabulary plus the server's bookkeeping.

``JobRecord.job`` is the ``corral.core.Job`` the scheduler sees; the other
fields are what only the server needs (versions, the fencing token, results).
Row <-> record conversion lives here so repos stay a list of queries.

Over 400 lines on purpose: a column added is converted both ways in one place, next to
the record that carries it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from corral.core.model import Allocation, Gpu, InputFile, Job, JobKind, Node, Team
from corral.core.model_names import lacked
from corral.core.resources import ResourceRequest
from corral.core.states import AllocDesired, AllocObserved, JobState, NodeState


@dataclass(frozen=True, slots=True)
class ResultFile:
    """One result blob of a job: what a client downloads from ``/v1/jobs/{id}/result/{name}``."""

    name: str
    key: str  # blob store key (its name alone when the bytes are inline)
    size: int
    content_type: str
    sha256: str
    inline: bytes | None = None  # a small result kept in the job row, not in the blob store

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "key": self.key,
            "size": self.size,
            "content_type": self.content_type,
            "sha256": self.sha256,
        }
        if self.inline is not None:
            out["data"] = base64.b64encode(self.inline).decode()
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ResultFile:
        inline = data.get("data")
        return ResultFile(
            data["name"],
            data["key"],
            data["size"],
            data["content_type"],
            data["sha256"],
            None if inline is None else base64.b64decode(inline),
        )


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One attempt that ended badly: where, and what it said (see ``services.attempts``)."""

    attempt: int
    node: str | None
    error: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "node": self.node, "error": self.error, "at": self.at}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> AttemptError:
        return AttemptError(
            int(data["attempt"]), data.get("node"), str(data["error"]), float(data["at"])
        )


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a job's state changes are posted: ``events`` is ``end`` (its final state only)
    or ``all`` (every state change)."""

    url: str
    events: str = "end"


@dataclass(frozen=True, slots=True)
class Take:
    """Result files of another job a job reads as inputs: ``file`` of job ``job`` (None:
    every file it made), called ``as_name`` by the job (None: its own name)."""

    job: str
    file: str | None = None
    as_name: str | None = None

    def to_json(self) -> list[str | None]:
        return [self.job, self.file, self.as_name]


@dataclass(frozen=True, slots=True)
class JobRecord:
    job: Job
    seq: int = 0
    version: int = 1
    failures: int = 0
    allocation_ids: tuple[str, ...] = ()  # current allocations: results only from them
    node: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    progress: float = 0.0
    checkpoint: str | None = None
    checkpoint_step: int | None = None  # the step the checkpoint holds, when reported
    resumed_step: int | None = None  # the latest attempt was handed a checkpoint of this step
    attempt_errors: tuple[AttemptError, ...] = ()  # failed attempts, oldest first
    stop_request: str | None = None  # "cancel" | "interrupt" while the agent winds down
    error: str | None = None
    result: tuple[ResultFile, ...] = ()
    request_hash: str | None = None
    interrupted: bool = False  # ended because a client interrupted it (its result is partial)
    ran: Mapping[str, str] | None = None  # model and parameters as run, where the agent chose
    held: bool = False  # queued, but not placed until released (``PATCH /v1/jobs/{id}``)
    queue_at: float | None = None  # its place in its user's own queue (None: submitted_at)
    webhook: Webhook | None = None  # called on its state changes (services/webhooks.py)
    labels: Mapping[str, str] = field(default_factory=dict)  # the client's own tags
    # Pipelines and arrays (services/dependencies.py, services/pipelines.py): the jobs it
    # runs after, each with "ok" (succeeded) or "any" (ended at all); the result files of
    # others it reads; the pipeline or array it belongs to and its step name or index there.
    after: tuple[tuple[str, str], ...] = ()
    takes: tuple[Take, ...] = ()
    group_id: str | None = None
    member: str | None = None

    @property
    def state(self) -> JobState:
        return self.job.state


@dataclass(frozen=True, slots=True)
class AllocRecord:
    alloc: Allocation
    created_at: float
    ended_at: float | None = None
    stop_reason: str | None = None
    stop_at: float | None = None
    stop_grace_s: float | None = None
    deadline_at: float | None = None
    expected_end_at: float | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node: Node
    joined_at: float
    version: int = 1
    failure_streak: int = 0  # jobs failed here in a row (a success resets it)
    pause_reason: str | None = None  # set when the server paused it automatically
    key_hash: str | None = None  # sha256 of the node key of the agent that holds the name
    token_id: str | None = None  # the join token that admitted its agent (its cap counts it)


def resources_to_json(r: ResourceRequest) -> dict[str, Any]:
    return {
        "gpus": r.gpus,
        "gpu_milli": r.gpu_milli,
        "vram_bytes": r.vram_bytes,
        "cpus": r.cpus,
        "gpu_models": sorted(r.gpu_models),
        "cpu_fallback": r.cpu_fallback,
        "memory_bytes": r.memory_bytes,
    }


def resources_from_json(d: Mapping[str, Any]) -> ResourceRequest:
    return ResourceRequest(
        gpus=d.get("gpus", 0),
        gpu_milli=d.get("gpu_milli", 0),
        vram_bytes=d.get("vram_bytes", 0),
        cpus=d.get("cpus", 1),
        gpu_models=frozenset(d.get("gpu_models", ())),
        cpu_fallback=d.get("cpu_fallback", False),
        memory_bytes=d.get("memory_bytes", 0),
    )


def job_row(rec: JobRecord) -> dict[str, Any]:
    """The column values of a new job row."""
    j = rec.job
    return {
        "id": j.id,
        "kind": j.kind.value,
        "state": j.state.value,
        "priority": j.priority,
        "team": j.team,
        "user": j.user,
        "model": j.model,
        "spec": {
            "resources": resources_to_json(j.resources),
            "node_selector": dict(j.node_selector),
            "gang_label": j.gang_label,
            **({"gang_label_required": True} if j.gang_label_required else {}),
            "model": j.model,
            **({"models": sorted(j.models)} if j.models else {}),
            "backend": j.backend,
            "batch_key": j.batch_key,
            "preemptible": j.preemptible,
            "payload": dict(j.payload),
            "estimated_runtime_s": j.estimated_runtime_s,
            **({"inputs": [[f.name, f.sha256] for f in j.inputs]} if j.inputs else {}),
            **({"labels": dict(rec.labels)} if rec.labels else {}),
            **({"after": [list(a) for a in rec.after]} if rec.after else {}),
            **({"takes": [t.to_json() for t in rec.takes]} if rec.takes else {}),
        },
        "replicas": j.replicas,
        "max_attempts": j.max_attempts,
        "timeout_s": j.timeout_s,
        "idempotency_key": j.idempotency_key,
        "request_hash": rec.request_hash,
        "submitted_at": j.submitted_at,
        "not_before": j.not_before,
        "attempt": j.attempt,
        "failures": rec.failures,
        "progress": rec.progress,
        "version": rec.version,
        "held": rec.held,
        "queue_at": rec.queue_at,
        "webhook_url": rec.webhook.url if rec.webhook else None,
        "webhook_events": rec.webhook.events if rec.webhook else None,
        "group_id": rec.group_id,
        "member": rec.member,
    }


def job_from_row(row: Any) -> JobRecord:
    spec = row.spec
    errors = tuple(AttemptError.from_json(e) for e in row.attempt_errors or ())
    job = Job(
        id=row.id,
        resources=resources_from_json(spec["resources"]),
        kind=JobKind(row.kind),
        priority=row.priority,
        team=row.team,
        user=row.user,
        node_selector=spec.get("node_selector") or {},
        replicas=row.replicas,
        gang_label=spec.get("gang_label"),
        gang_label_required=bool(spec.get("gang_label_required", False)),
        model=spec.get("model"),
        backend=spec.get("backend"),
        batch_key=spec.get("batch_key"),
        preemptible=spec.get("preemptible", True),
        payload=spec.get("payload") or {},
        timeout_s=row.timeout_s,
        max_attempts=row.max_attempts,
        idempotency_key=row.idempotency_key,
        submitted_at=row.submitted_at,
        not_before=row.not_before,
        estimated_runtime_s=spec.get("estimated_runtime_s"),
        state=JobState(row.state),
        attempt=row.attempt,
        avoid_nodes=frozenset(e.node for e in errors if e.node) if errors else frozenset(),
        models=frozenset(spec.get("models") or ()),
        lacking_nodes=lacking_nodes(errors) if errors else frozenset(),
        inputs=tuple(InputFile(n, sha) for n, sha in spec.get("inputs") or ()),
    )
    return JobRecord(
        job=job,
        seq=row.seq,
        version=row.version,
        failures=row.failures,
        allocation_ids=tuple(row.allocation_ids or ()),
        node=row.node,
        started_at=row.started_at,
        finished_at=row.finished_at,
        progress=row.progress,
        checkpoint=row.checkpoint,
        checkpoint_step=row.checkpoint_step,
        resumed_step=row.resumed_step,
        attempt_errors=errors,
        stop_request=row.stop_request,
        error=row.error,
        result=tuple(ResultFile.from_json(f) for f in row.result or ()),
        request_hash=row.request_hash,
        interrupted=bool(row.interrupted),
        ran=row.ran,
        held=bool(row.held),
        queue_at=row.queue_at,
        webhook=Webhook(row.webhook_url, row.webhook_events or "end") if row.webhook_url else None,
        labels=spec.get("labels") or {},
        after=tuple((a[0], a[1]) for a in spec.get("after") or ()),
        takes=tuple(Take(t[0], t[1], t[2]) for t in spec.get("takes") or ()),
        group_id=row.group_id,
        member=row.member,
    )


def lacking_nodes(errors: Iterable[AttemptError]) -> frozenset[str]:
    """Nodes whose backend refused the job for a model they lack (``model_names.lacking``)."""
    return frozenset(e.node for e in errors if e.node and lacked(e.error))


def alloc_row(rec: AllocRecord) -> dict[str, Any]:
    a = rec.alloc
    return {
        "id": a.id,
        "job_ids": list(a.job_ids),
        "node": a.node,
        "team": a.team,
        "user": a.user,
        "priority": a.priority,
        "replica": a.replica,
        "gpu_indices": list(a.gpu_indices),
        "gpu_milli": a.gpu_milli,
        "vram_bytes": a.vram_bytes,
        "cpus": a.cpus,
        "on_cpu": a.on_cpu,
        "memory_bytes": a.memory_bytes,
        "preemptible": a.preemptible,
        "borrowed": a.borrowed,
        "attempt": a.attempt,
        "created_at": rec.created_at,
        "started_at": a.started_at or None,
        "progress": a.progress,
        "desired": a.desired.value,
        "observed": a.observed.value,
        "active": a.active,
        "version": rec.version,
    }


def alloc_from_row(row: Any) -> AllocRecord:
    alloc = Allocation(
        id=row.id,
        job_ids=tuple(row.job_ids),
        node=row.node,
        team=row.team,
        user=row.user,
        priority=row.priority,
        replica=row.replica,
        gpu_indices=tuple(row.gpu_indices),
        gpu_milli=row.gpu_milli,
        vram_bytes=row.vram_bytes,
        cpus=row.cpus,
        on_cpu=row.on_cpu,
        memory_bytes=row.memory_bytes,
        preemptible=row.preemptible,
        borrowed=row.borrowed,
        attempt=row.attempt,
        started_at=row.started_at or 0.0,
        last_checkpoint_at=row.last_checkpoint_at,
        progress=row.progress,
        desired=AllocDesired(row.desired),
        observed=AllocObserved(row.observed),
    )
    return AllocRecord(
        alloc=alloc,
        created_at=row.created_at,
        ended_at=row.ended_at,
        stop_reason=row.stop_reason,
        stop_at=row.stop_at,
        stop_grace_s=row.stop_grace_s,
        deadline_at=row.deadline_at,
        expected_end_at=row.expected_end_at,
        version=row.version,
    )


def inventory_to_json(node: Node) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "vram_bytes": g.vram_bytes,
                "vram_free_bytes": g.vram_free_bytes,
                "utilization": g.utilization,
                "temperature_c": g.temperature_c,
                "numa": g.numa,
                "links": list(g.links),
            }
            for g in node.gpus
        ],
        "cpus": node.cpus,
        "labels": dict(node.labels),
        "models_on_disk": sorted(node.models_on_disk),
        "models_loaded": sorted(node.models_loaded),
        "backends": sorted(node.backends),
        "numa_cpus": [list(pair) for pair in node.numa_cpus],
        "memory_bytes": node.memory_bytes,
    }


_LIVE = ("vram_free_bytes", "utilization", "temperature_c")  # what a heartbeat measures


def gpu_live_to_json(gpus: Sequence[Gpu]) -> list[dict[str, Any]]:
    """A heartbeat's figures for ``nodes.gpu_live``: per GPU index, what it measures."""
    return [{"index": g.index, **{k: getattr(g, k) for k in _LIVE}} for g in gpus]


def _with_live(gpus: tuple[Gpu, ...], live: list[dict[str, Any]] | None) -> tuple[Gpu, ...]:
    """The inventory's GPUs with the latest heartbeat's figures over the hello's."""
    if not live:
        return gpus
    by_index = {g["index"]: g for g in live}
    return tuple(
        replace(g, **{k: by_index[g.index][k] for k in _LIVE if k in by_index[g.index]})
        if g.index in by_index
        else g
        for g in gpus
    )


def gpu_from_json(g: dict[str, Any]) -> Gpu:
    """A stored GPU; one stored before topology was reported has none."""
    return Gpu(**{**g, "links": tuple(g.get("links", ()))})


def node_from_row(row: Any) -> NodeRecord:
    inv = row.inventory
    node = Node(
        name=row.name,
        gpus=_with_live(tuple(gpu_from_json(g) for g in inv.get("gpus", ())), row.gpu_live),
        cpus=inv.get("cpus", 0),
        labels=inv.get("labels") or {},
        models_on_disk=frozenset(inv.get("models_on_disk", ())),
        models_loaded=frozenset(inv.get("models_loaded", ())),
        backends=frozenset(inv.get("backends", ())),
        numa_cpus=tuple((int(n), float(c)) for n, c in inv.get("numa_cpus", ())),
        memory_bytes=inv.get("memory_bytes", 0),
        state=NodeState(row.state),
        paused=row.paused,
        draining=row.draining,
        last_seen=row.last_seen,
    )
    return NodeRecord(
        node=node,
        joined_at=row.joined_at,
        version=row.version,
        failure_streak=row.failure_streak or 0,
        pause_reason=row.pause_reason,
        key_hash=row.key_hash,
        token_id=row.token_id,
    )


def team_from_row(row: Any) -> Team:
    return Team(
        name=row.name,
        quota_gpus=row.quota_gpus,
        borrow_limit_gpus=row.borrow_limit_gpus,
        weight=row.weight,
    )
