"""The JSON shapes of the HTTP API (request and response models).

Input models validate ranges and formats so a bad field gets a 422 naming
it; ``to_job`` turns a submission into the core ``Job`` (whose own checks
also name the field). Output models are built from store records by the
``*_out`` functions, so routers stay thin.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral.core.errors import InvalidSpec
from corral.core.model import DEFAULT_TEAM, InputFile, Job, JobKind
from corral.core.model_names import MAX_MODELS, is_checkpoint, job_models
from corral.core.resources import ResourceRequest, parse_bytes

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
Label = Annotated[str, Field(min_length=1, max_length=255)]
MAX_TIMEOUT_S = 30 * 24 * 3600.0
MAX_VRAM = 2**50  # 1 PiB: far above any card, far below a 64-bit overflow


class ApiModel(BaseModel):
    """Base of request bodies: no NUL characters anywhere (PostgreSQL cannot store them)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if has_nul(value):
            raise ValueError("must not contain NUL characters")
        return value


def has_nul(value: Any) -> bool:
    """Does a JSON value hold a NUL character anywhere (keys included)?"""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False


class ResourcesIn(ApiModel):
    """What one replica needs: ``gpus`` 1, 2, ... whole cards; 0 < gpus < 1 a share of one."""

    gpus: float = Field(0, ge=0, le=1024, allow_inf_nan=False, examples=[1, 0.5])
    vram: int | str | None = Field(
        None,
        description="VRAM per GPU, bytes or '12GiB': the minimum for whole GPUs, "
        "the reservation for a share of one GPU",
        examples=["12GiB"],
    )
    cpus: int = Field(1, ge=0, le=4096)
    gpu_models: list[Label] = Field(default_factory=list, max_length=32)
    cpu_fallback: bool = False

    def to_request(self) -> ResourceRequest:
        try:
            vram = parse_bytes(self.vram, field_name="vram") if self.vram is not None else 0
            if vram > MAX_VRAM:
                raise InvalidSpec("vram", f"{vram} bytes is more VRAM than any GPU has")
            return ResourceRequest.from_gpus(
                self.gpus,
                vram_bytes=vram,
                cpus=self.cpus,
                gpu_models=frozenset(self.gpu_models),
                cpu_fallback=self.cpu_fallback,
            )
        except InvalidSpec as e:
            field = e.field if e.field.startswith("resources.") else f"resources.{e.field}"
            raise InvalidSpec(field, e.message) from None


class InputIn(ApiModel):
    """An uploaded file the job reads (``POST /v1/inputs``)."""

    blob: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="its sha256")]
    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=255,
            pattern=r"^[^\\\x00-\x1f]+$",
            description="what the payload calls it: a ComfyUI LoadImage's image (which may "
            "name a subfolder, 'masks/a.png'), an A1111 init image's file name",
        ),
    ]

    @field_validator("name")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError("a relative name, without '..'")
        return value


class InputOut(BaseModel):
    blob: str
    name: str


class JobIn(ApiModel):
    """A job to submit."""

    kind: JobKind = JobKind.CUSTOM
    payload: dict[str, Any] = Field(default_factory=dict, description="handed to the executor")
    resources: ResourcesIn = Field(default_factory=lambda: ResourcesIn.model_validate({}))
    priority: Name = Field("free", description="a priority class: interactive, paid, free, batch")
    team: Name | None = Field(None, description="default: the token's team, or 'default'")
    user: Annotated[str, Field(min_length=1, max_length=128)] = "anonymous"
    node_selector: dict[Label, Label] = Field(default_factory=dict, max_length=32)
    replicas: int = Field(1, ge=1, le=1024, description="> 1: a gang, placed all or nothing")
    gang_label: Label | None = None
    gang_label_required: bool = Field(
        False, description="place the gang only on nodes sharing one value of gang_label"
    )
    model: Label | None = None
    models: list[Label] = Field(
        default_factory=list,
        max_length=MAX_MODELS,
        description="further models it uses (lora:<name>, vae:<name> ...): routed where they are",
    )
    backend: Name | None = None
    batch_key: Label | None = None
    preemptible: bool = True
    timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    max_attempts: int = Field(3, ge=1, le=100)
    estimated_runtime_s: float | None = Field(None, ge=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    idempotency_key: Label | None = Field(
        None, description="batch items: the same key returns the same job (or use the header)"
    )
    inputs: list[InputIn] = Field(
        default_factory=list,
        max_length=256,
        description="uploaded files the agent hands the job's backend (docs/server.md)",
    )

    @field_validator("payload")
    @classmethod
    def _plain_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise ValueError("NaN and Infinity are not JSON numbers") from None
        return value

    def to_job(self, job_id: str, *, team: str | None, idempotency_key: str | None) -> Job:
        """The core Job; ``team`` is the resolved team (token's or default)."""
        return Job(
            id=job_id,
            resources=self.resources.to_request(),
            kind=self.kind,
            priority=self.priority,
            team=self.team or team or DEFAULT_TEAM,
            user=self.user,
            node_selector=self.node_selector,
            replicas=self.replicas,
            gang_label=self.gang_label,
            gang_label_required=self.gang_label_required,
            model=self.model,
            models=self._models(),
            backend=self.backend,
            batch_key=self.batch_key,
            preemptible=self.preemptible,
            payload=self.payload,
            timeout_s=self.timeout_s,
            max_attempts=self.max_attempts,
            idempotency_key=idempotency_key or self.idempotency_key,
            estimated_runtime_s=self.estimated_runtime_s,
            inputs=tuple(InputFile(f.name, f.blob) for f in self.inputs),
        )

    def _models(self) -> frozenset[str]:
        """The models it names besides ``model``: those given, and those its payload names
        (``model_names.job_models``). A ``model`` replaces the graph's checkpoints (the
        executor loads it in every loader), so theirs do not count then."""
        found = frozenset(self.models) | job_models(self.backend, self.payload)
        if self.model is not None:
            found = frozenset(m for m in found if not is_checkpoint(m))
        return found

    def request_hash(self, team: str) -> str:
        """What makes two submissions "the same request" for idempotency."""
        # ``models``, ``inputs`` and ``gang_label_required`` count only when given, so a
        # request hashes as it did before they existed (idempotency keys stay replayable)
        unset = {"idempotency_key"} | (set() if self.models else {"models"})
        unset |= set() if self.inputs else {"inputs"}
        unset |= set() if self.gang_label_required else {"gang_label_required"}
        body = self.model_dump(mode="json", exclude=unset) | {"team": team}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class BatchIn(ApiModel):
    jobs: list[JobIn] = Field(min_length=1, description="submitted together: all or none")


class ResourcesOut(BaseModel):
    gpus: int
    gpu_milli: int
    vram_bytes: int
    cpus: int
    gpu_models: list[str]
    cpu_fallback: bool


class ResultFileOut(BaseModel):
    name: str
    size: int
    content_type: str
    sha256: str
    url: str


class ResultOut(BaseModel):
    id: str
    state: str
    error: str | None
    files: list[ResultFileOut] = Field(description="empty until the job succeeded")


class ReasonOut(BaseModel):
    code: str
    nodes: int
    message: str


class QueueInfo(BaseModel):
    """Why a queued job waits (from the last scheduling cycle)."""

    position: int
    remedy: str | None = None
    summary: str = ""
    reasons: list[ReasonOut] = Field(default_factory=list)
    advice: str | None = Field(
        default=None, description="what to do when no node can ever run it (remedy none)"
    )


class EtaOut(BaseModel):
    """When the job is expected to start and end: an estimate, re-made every few seconds
    while work is queued (docs/scheduler.md, "ETA")."""

    start_at: float | None = Field(
        None, description="expected start, epoch seconds (queued jobs; null: not foreseen)"
    )
    end_at: float | None = Field(None, description="expected end, epoch seconds")
    runtime_s: float = Field(description="predicted run time, seconds")
    basis: str = Field(
        description="what the run time rests on: history, estimate (the job's own, corrected "
        "by history), progress, default (nothing finished yet); beyond (queued past the "
        "estimate's horizon) or never (no node that could run it frees up)"
    )
    computed_at: float = Field(description="when the estimate was made, epoch seconds")


class AttemptOut(BaseModel):
    """One attempt that ended badly."""

    attempt: int
    node: str | None
    error: str
    at: float


class JobOut(BaseModel):
    id: str
    kind: str
    state: str
    priority: str
    team: str
    user: str
    resources: ResourcesOut
    payload: dict[str, Any]
    inputs: list[InputOut] = Field(default_factory=list, description="files the job reads")
    node_selector: dict[str, str]
    replicas: int
    gang_label: str | None
    gang_label_required: bool = False
    model: str | None
    models: list[str] = Field(default_factory=list, description="further models it uses")
    backend: str | None
    batch_key: str | None
    preemptible: bool
    timeout_s: float | None
    max_attempts: int
    idempotency_key: str | None
    submitted_at: float
    not_before: float
    started_at: float | None
    finished_at: float | None
    attempt: int
    failures: int
    node: str | None
    allocations: list[str]
    progress: float
    checkpoint: str | None
    checkpoint_step: int | None = Field(None, description="the step the checkpoint holds")
    resumed_from_step: int | None = Field(
        None, description="the latest attempt resumed from a checkpoint of this step"
    )
    attempts: list[AttemptOut] = Field(
        default_factory=list, description="attempts that failed or were lost, oldest first"
    )
    error: str | None
    interrupted: bool = Field(
        False,
        description="a client interrupted it: succeeded with what it made so far, or "
        "cancelled when it had made nothing",
    )
    ran: dict[str, str] | None = Field(
        None,
        description="the model and parameters it ran with where the request left them open "
        "(the backend's loaded model, a sampler, a drawn seed); null until the agent "
        "reports its end",
    )
    result: list[ResultFileOut]
    queue: QueueInfo | None = None
    eta: EtaOut | None = Field(
        None, description="expected start and end; null once it ended, or before an estimate"
    )


class JobPage(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next page; null at the end"
    )


class BatchOut(BaseModel):
    jobs: list[JobOut]


class ErrorOut(BaseModel):
    """Every 4xx/5xx body."""

    error: str = Field(description="a short code: invalid, unauthenticated, forbidden, ...")
    message: str
    field: str | None = None
    fields: list[dict[str, str]] | None = None
