"""Store records -> response models, and the node/team/token/queue shapes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from corral.core.events import Event
from corral.core.model import Team
from corral.scheduler.api import ReasonCode, Unplaced
from corral.scheduler.eta import Eta
from corral.server.api.advice import advice
from corral.server.api.schemas import (
    ApiModel,
    AttemptOut,
    JobOut,
    QueueInfo,
    ReasonOut,
)
from corral.server.services.auth import TokenInfo
from corral.server.services.nodes import NodeView
from corral.server.store.records import JobRecord, resources_to_json

HELD = "held: release it to let it be placed (corral release ID)"


def held_info(position: int = 0) -> QueueInfo:
    """Why a held job waits: no cycle looks at it until it is released (no remedy but that)."""
    reason = ReasonOut(code=ReasonCode.HELD.value, nodes=0, message=HELD)
    return QueueInfo(position=position, remedy=None, summary=HELD, reasons=[reason])


def queue_info(u: Unplaced | None, position: int | None = None) -> QueueInfo:
    if u is None:
        return QueueInfo(position=position or 0, summary="not considered by a scheduling cycle yet")
    return QueueInfo(
        position=u.position if position is None else position,
        remedy=u.remedy.value,
        summary=u.summary(),
        reasons=[ReasonOut(code=r.code.value, nodes=r.nodes, message=r.message) for r in u.reasons],
        advice=advice(u),
    )


def job_fields(
    rec: JobRecord,
    unplaced: Unplaced | None = None,
    *,
    queued: bool = True,
    eta: tuple[Eta, float] | None = None,
) -> dict[str, Any]:
    """A job as ``JobOut``'s fields, in plain JSON values: ``job_out`` validates them into
    the model; the submit route writes them as its 201's body directly (a ``JobOut`` built
    and dumped cost 9.4 us for a placed job, these written 4.3 us; a test holds the two to
    the same JSON). Not ``job_row``'s fields, though they begin alike: those are the table's.
    """
    j = rec.job
    return {
        "id": j.id,
        "kind": j.kind.value,
        "state": j.state.value,
        "priority": j.priority,
        "team": j.team,
        "user": j.user,
        "resources": resources_to_json(j.resources),
        "payload": dict(j.payload),
        "inputs": [{"blob": f.sha256, "name": f.name} for f in j.inputs],
        "node_selector": dict(j.node_selector),
        "replicas": j.replicas,
        "gang_label": j.gang_label,
        "gang_label_required": j.gang_label_required,
        "model": j.model,
        "models": sorted(j.models),
        "backend": j.backend,
        "batch_key": j.batch_key,
        "preemptible": j.preemptible,
        "timeout_s": j.timeout_s,
        "max_attempts": j.max_attempts,
        "idempotency_key": j.idempotency_key,
        "submitted_at": j.submitted_at,
        "not_before": j.not_before,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
        "attempt": j.attempt,
        "failures": rec.failures,
        "node": rec.node,
        "allocations": list(rec.allocation_ids),
        "progress": rec.progress,
        "checkpoint": rec.checkpoint,
        "checkpoint_step": rec.checkpoint_step,
        "resumed_from_step": rec.resumed_step,
        "attempts": [AttemptOut(**e.to_json()).model_dump() for e in rec.attempt_errors],
        "error": rec.error,
        "interrupted": rec.interrupted,
        "ran": dict(rec.ran) if rec.ran else None,
        "result": [
            {
                "name": f.name,
                "size": f.size,
                "content_type": f.content_type,
                "sha256": f.sha256,
                "url": f"/v1/jobs/{j.id}/result/{f.name}",
            }
            for f in rec.result
        ],
        "placement": None,  # read only for one job (GET /v1/jobs/{id}: job_placement.py)
        "queue": (
            (held_info() if rec.held else queue_info(unplaced)).model_dump()
            if queued and j.state.value == "queued"
            else None
        ),
        "held": rec.held,
        "labels": dict(rec.labels),
        "webhook": (
            {"url": rec.webhook.url, "events": rec.webhook.events} if rec.webhook else None
        ),
        "after": [{"job": dep, "need": need} for dep, need in rec.after],
        "inputs_from": [{"from": t.job, "file": t.file, "as": t.as_name} for t in rec.takes],
        "pipeline": group_of(rec, "pipe_", "step"),
        "array": group_of(rec, "arr_", "index"),
        "eta": eta_fields(eta) if eta is not None and j.state.value in _ETA_STATES else None,
    }


def group_of(rec: JobRecord, prefix: str, what: str) -> dict[str, Any] | None:
    """The pipeline (or array) ``rec`` belongs to and its step name (or index) there."""
    if rec.group_id is None or not rec.group_id.startswith(prefix):
        return None
    member: Any = rec.member
    return {"id": rec.group_id, what: int(member) if what == "index" else member}


_ETA_STATES = frozenset({"queued", "placed", "running"})  # an ended job's ETA is stale


def eta_fields(eta: tuple[Eta, float]) -> dict[str, Any]:
    """An ``Eta`` made at a time as ``EtaOut``'s fields."""
    e, at = eta
    return {
        "start_at": e.start_at,
        "end_at": e.end_at,
        "runtime_s": round(e.runtime_s, 3),
        "basis": e.basis,
        "computed_at": at,
    }


def job_out(
    rec: JobRecord,
    unplaced: Unplaced | None = None,
    *,
    queued: bool = True,
    eta: tuple[Eta, float] | None = None,
) -> JobOut:
    return JobOut.model_validate(job_fields(rec, unplaced, queued=queued, eta=eta))


class GpuOut(BaseModel):
    index: int
    model: str
    vram_bytes: int
    vram_free_bytes: int | None = None
    utilization: float | None = None
    temperature_c: float | None = Field(None, description="degrees Celsius, as last measured")
    numa: int = Field(-1, description="its NUMA node; -1: unknown")
    links: list[str] = Field(
        default_factory=list,
        description="its link to each GPU by index: nvlink, pcie_switch, same_socket, "
        "cross_socket ('' itself); empty: unknown",
    )


class AllocationOut(BaseModel):
    id: str
    job_ids: list[str]
    replica: int
    attempt: int
    gpu_indices: list[int]
    gpu_milli: int
    vram_bytes: int
    cpus: float
    on_cpu: bool
    memory_bytes: int = 0
    borrowed: bool
    desired: str
    observed: str
    progress: float


class NodeOut(BaseModel):
    name: str
    state: str
    paused: bool
    pause_reason: str | None = Field(
        None, description="why the server paused it by itself (jobs failing in a row)"
    )
    failure_streak: int = Field(0, description="jobs that failed here in a row")
    draining: bool
    schedulable: bool
    gpus: list[GpuOut]
    cpus: float
    numa_cpus: dict[int, float] = Field(
        default_factory=dict,
        description="CPU slots of each NUMA node, by node; empty: not reported (the node's "
        "CPUs are one pool)",
    )
    memory_bytes: int = Field(
        0, description="host memory jobs may request, bytes (RAM less the agent's reserve)"
    )
    labels: dict[str, str]
    models_on_disk: list[str]
    models_loaded: list[str]
    backends: list[str]
    last_seen: float
    joined_at: float
    allocations: list[AllocationOut]


def node_out(view: NodeView) -> NodeOut:
    n = view.record.node
    return NodeOut(
        name=n.name,
        state=n.state.value,
        paused=n.paused,
        pause_reason=view.record.pause_reason,
        failure_streak=view.record.failure_streak,
        draining=n.draining,
        schedulable=n.schedulable,
        gpus=[GpuOut(**_fields(g)) for g in n.gpus],
        cpus=n.cpus,
        numa_cpus=dict(n.numa_cpus),
        memory_bytes=n.memory_bytes,
        labels=dict(n.labels),
        models_on_disk=sorted(n.models_on_disk),
        models_loaded=sorted(n.models_loaded),
        backends=sorted(n.backends),
        last_seen=n.last_seen,
        joined_at=view.record.joined_at,
        allocations=[
            AllocationOut(
                id=a.id,
                job_ids=list(a.job_ids),
                replica=a.replica,
                attempt=a.attempt,
                gpu_indices=list(a.gpu_indices),
                gpu_milli=a.gpu_milli,
                vram_bytes=a.vram_bytes,
                cpus=a.cpus,
                on_cpu=a.on_cpu,
                memory_bytes=a.memory_bytes,
                borrowed=a.borrowed,
                desired=a.desired.value,
                observed=a.observed.value,
                progress=a.progress,
            )
            for a in view.allocations
        ],
    )


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


class TeamIn(ApiModel):
    quota_gpus: float = Field(0.0, ge=0, le=1_000_000, allow_inf_nan=False)
    borrow_limit_gpus: float | None = Field(
        None, ge=0, le=1_000_000, allow_inf_nan=False, description="null: may borrow any idle GPU"
    )
    weight: float = Field(1.0, gt=0, le=1_000_000, allow_inf_nan=False)


class TeamOut(TeamIn):
    name: str


def team_out(t: Team) -> TeamOut:
    return TeamOut(
        name=t.name, quota_gpus=t.quota_gpus, borrow_limit_gpus=t.borrow_limit_gpus, weight=t.weight
    )


class TokenIn(ApiModel):
    kind: str = Field(pattern="^(team|agent)$", description="team or agent")
    name: str = Field(min_length=1, max_length=128)
    team: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
    )


class TokenOut(BaseModel):
    id: str
    kind: str
    name: str
    team: str | None
    created_at: float
    revoked: bool


class NewTokenOut(TokenOut):
    token: str = Field(description="the secret: shown once, store it now")
    join: str | None = Field(
        None,
        description="agent tokens: what `corral agent --join` takes, the token with the "
        "server certificate's fingerprint when it is self-signed (sha256:<hex>::<token>)",
    )
    join_command: str | None = Field(
        None, description="agent tokens: the command a GPU machine joins with"
    )


def token_out(t: TokenInfo) -> TokenOut:
    return TokenOut(
        id=t.id,
        kind=t.kind.value,
        name=t.name,
        team=t.team,
        created_at=t.created_at,
        revoked=t.revoked,
    )


class QueueEntryOut(BaseModel):
    job: JobOut
    position: int
    queue: QueueInfo


class QueueOut(BaseModel):
    total: int = Field(description="queued jobs visible to this token")
    entries: list[QueueEntryOut]


def event_json(event: Event, team: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": event.seq,
        "kind": event.kind.value,
        "at": event.at,
        "job_id": event.job_id,
        "node": event.node,
        "data": dict(event.data),
    }
    if team is not None:
        out["team"] = team
    return out
