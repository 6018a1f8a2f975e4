"""The JSON shapes of the HTTP API (request and response models).

Input models validate ranges and formats so a bad field gets a 422 naming
it; ``to_job`` turns a submission into the core ``Job`` (whose own checks
also name the field). Output models are built from store records by the
``*_out`` functions, so routers stay thin.

Over 400 lines on purpose: a job's request and response shapes are read together, each
field's checks beside its description; other routes' shapes live beside their routers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.core.errors import InvalidSpec
from corral.core.model import DEFAULT_TEAM, InputFile, Job, JobKind
from corral.core.model_names import MAX_MODELS, is_checkpoint, job_models
from corral.core.resources import ResourceRequest, parse_bytes, parse_cpus, parse_memory
from corral.server.api.whereabouts import EtaOut, PlacedOut
from corral.server.store.records import Take
from corral.server.webhook_urls import check_form

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
Label = Annotated[str, Field(min_length=1, max_length=255)]
MAX_TIMEOUT_S = 30 * 24 * 3600.0
EMPTY_IDS: Mapping[str, str] = MappingProxyType({})
MAX_AFTER = 64  # jobs one job runs after: a pipeline's fan-in, not a way to watch the queue
MAX_VRAM = 2**50  # 1 PiB: far above any card, far below a 64-bit overflow
MAX_JOB_CPUS = 4096  # one replica asks for at most this many: far above any machine today


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
    # int first: a whole count keeps its JSON form (and so its request hash) from before
    cpus: int | float | str = Field(
        1,
        description="CPUs per replica, to a milli-CPU: 2, 0.5 or '500m'",
        examples=[1, 0.5, "500m"],
    )
    gpu_models: list[Label] = Field(default_factory=list, max_length=32)
    cpu_fallback: bool = False
    memory: int | float | str | None = Field(
        None,
        description="host memory per replica: bytes or a Kubernetes quantity ('512Mi', "
        "'16Gi', '1G'); the job waits for a node with that much free",
        examples=["16Gi"],
    )

    @field_validator("memory", mode="before")
    @classmethod
    def _memory_as_sent(cls, value: Any) -> Any:
        """A number or a quantity, as sent: never ``true`` read as 1 byte (``to_request``
        parses it)."""
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float | str)
        ):
            raise ValueError(f"expected bytes or a quantity like '16Gi', got {value!r}")
        return value

    def to_request(self) -> ResourceRequest:
        try:
            vram = parse_bytes(self.vram, field_name="vram") if self.vram is not None else 0
            if vram > MAX_VRAM:
                raise InvalidSpec("vram", f"{vram} bytes is more VRAM than any GPU has")
            return ResourceRequest.from_gpus(
                self.gpus,
                vram_bytes=vram,
                cpus=_cpus(self.cpus),
                gpu_models=frozenset(self.gpu_models),
                cpu_fallback=self.cpu_fallback,
                memory_bytes=parse_memory(self.memory) if self.memory is not None else 0,
            )
        except InvalidSpec as e:
            field = e.field if e.field.startswith("resources.") else f"resources.{e.field}"
            raise InvalidSpec(field, e.message) from None


def _cpus(value: float | str) -> float:
    """``resources.cpus`` to a milli-CPU, at most ``MAX_JOB_CPUS``."""
    cpus = parse_cpus(value, field_name="cpus")
    if cpus > MAX_JOB_CPUS:
        raise InvalidSpec("cpus", f"{value!r} is more than {MAX_JOB_CPUS} CPUs")
    return cpus


class InputIn(ApiModel):
    """A file the job reads: an uploaded one (``blob`` and ``name``), or the result files of
    another job (``from``: a job id, or a step of the same pipeline; ``file``: one of its
    files, else all of them; ``as``: the name the job reads it by)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    blob: Annotated[str | None, Field(pattern=r"^[0-9a-f]{64}$", description="its sha256")] = None
    name: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=255,
            pattern=r"^[^\\\x00-\x1f]+$",
            description="what the payload calls it: a ComfyUI LoadImage's image (which may "
            "name a subfolder, 'masks/a.png'), an A1111 init image's file name",
        ),
    ] = None
    from_: Annotated[
        str | None,
        Field(
            alias="from",
            min_length=1,
            max_length=64,
            description="a job id (or a step's name in a pipeline) whose result files it reads",
        ),
    ] = None
    file: Annotated[str | None, Field(min_length=1, max_length=255)] = None
    as_: Annotated[str | None, Field(alias="as", min_length=1, max_length=255)] = None

    @field_validator("name", "file", "as_")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError("a relative name, without '..'")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> InputIn:
        if (self.blob is None) == (self.from_ is None):
            raise ValueError("give either blob (an uploaded file) or from (another job's results)")
        if self.blob is not None and (self.name is None or self.file or self.as_):
            raise ValueError("an uploaded file takes blob and name (not file or as)")
        if self.from_ is not None and self.name is not None:
            raise ValueError("a job's result file takes from, file and as (not name)")
        if self.as_ is not None and self.file is None:
            raise ValueError("as renames one file: name it with file")
        return self


class InputOut(BaseModel):
    blob: str
    name: str


MAX_URL = 2048
MAX_LABELS = 32


class WebhookIn(ApiModel):
    """Where to post the job's state changes, signed with the team's secret (docs/server.md,
    "Webhooks")."""

    url: Annotated[str, Field(min_length=8, max_length=MAX_URL, examples=["https://x.io/hook"])]
    events: Literal["end", "all"] = Field(
        "end", description="end: its final state only; all: every state change"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        check_form(value)
        return value


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
        description="uploaded files the agent hands the job's backend (docs/server.md), "
        "or other jobs' result files ({from, file, as})",
    )
    after: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=MAX_AFTER,
        description="jobs (or, in a pipeline, steps) that must succeed before it is queued",
    )
    after_any: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=MAX_AFTER,
        description="jobs (or steps) that must end, in any state, before it is queued",
    )
    labels: dict[Label, Label] = Field(
        default_factory=dict, max_length=MAX_LABELS, description="the client's own tags"
    )
    webhook: WebhookIn | None = Field(None, description="called when it ends (or on each change)")

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
            inputs=tuple(
                InputFile(f.name, f.blob) for f in self.inputs if f.blob and f.name is not None
            ),
        )

    def takes(self, ids: Mapping[str, str] = EMPTY_IDS) -> tuple[Take, ...]:
        """The result files of other jobs it reads; ``ids``: a pipeline's step names' jobs."""
        return tuple(
            Take(ids.get(f.from_, f.from_), f.file, f.as_)
            for f in self.inputs
            if f.from_ is not None
        )

    def dependencies(self) -> list[tuple[str, str, str]]:
        """(reference, need, field) of every job it runs after: ``after`` (need "ok"),
        ``after_any`` ("any") and the jobs it reads results of (need "ok"), first named
        first; a reference is a job id, or a step's name in a pipeline."""
        found: dict[str, tuple[str, str, str]] = {}
        for i, ref in enumerate(self.after):
            found.setdefault(ref, (ref, "ok", f"after[{i}]"))
        for i, f in enumerate(self.inputs):
            if f.from_ is not None:
                found.setdefault(f.from_, (f.from_, "ok", f"inputs[{i}].from"))
        for i, ref in enumerate(self.after_any):
            found.setdefault(ref, (ref, "any", f"after_any[{i}]"))
        return list(found.values())

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
        unset |= set() if self.after else {"after"}
        unset |= set() if self.after_any else {"after_any"}
        unset |= set() if self.gang_label_required else {"gang_label_required"}
        unset |= set() if self.labels else {"labels"}
        unset |= set() if self.webhook else {"webhook"}
        exclude: dict[str, Any] = dict.fromkeys(unset, True)
        if self.resources.memory is None:
            exclude["resources"] = {"memory"}
        body = self.model_dump(mode="json", exclude=exclude) | {"team": team}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class BatchIn(ApiModel):
    jobs: list[JobIn] = Field(min_length=1, description="submitted together: all or none")


class ResourcesOut(BaseModel):
    gpus: int
    gpu_milli: int
    vram_bytes: int
    cpus: float
    gpu_models: list[str]
    cpu_fallback: bool
    memory_bytes: int = Field(0, description="host memory per replica, bytes; 0: none asked")


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


class AttemptOut(BaseModel):
    """One attempt that ended badly."""

    attempt: int
    node: str | None
    error: str
    at: float


class AfterOut(BaseModel):
    job: str
    need: str


class TakeOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    file: str | None
    as_: str | None = Field(alias="as")


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
    placement: list[PlacedOut] | None = Field(
        None, description="its allocations and their GPUs (GET /v1/jobs/{id} only)"
    )
    held: bool = Field(False, description="queued but not placed until released")
    labels: dict[str, str] = Field(default_factory=dict, description="the client's own tags")
    webhook: dict[str, str] | None = Field(None, description="url and events, as submitted")
    after: list[AfterOut] = Field(
        default_factory=list, description="jobs it runs after; need ok: succeeded, any: ended"
    )
    inputs_from: list[TakeOut] = Field(
        default_factory=list, description="result files of other jobs it reads as inputs"
    )
    pipeline: dict[str, Any] | None = Field(None, description="{id, step} of its pipeline")
    array: dict[str, Any] | None = Field(None, description="{id, index} of its job array")
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
