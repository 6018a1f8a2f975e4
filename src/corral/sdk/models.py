"""Typed views of the API's JSON: what a client submits (``JobSpec``) and what it reads back.

The output models ignore fields they do not know, so an SDK keeps working
against a newer server; the input model forbids unknown fields, so a typo
(``gpu=1``) fails here, naming the field, before anything is sent.

Over 400 lines on purpose: the SDK's whole vocabulary, declarations only, in one module a
user reads top to bottom.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from corral.core.states import JobState

TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Resources(BaseModel):
    """What one replica needs: ``gpus`` whole cards (or 0 < gpus < 1: a share of one)."""

    model_config = ConfigDict(extra="forbid")

    gpus: float = 0
    vram: int | str | None = Field(default=None, description="bytes or '12GiB'")
    cpus: int | float | str = Field(default=1, description="to a milli-CPU: 2, 0.5 or '500m'")
    gpu_models: list[str] = Field(default_factory=list)
    cpu_fallback: bool = False
    memory: int | str | None = Field(
        default=None, description="host memory: bytes or a quantity like '16Gi' or '512Mi'"
    )


class JobSpec(BaseModel):
    """A job to submit (the body of ``POST /v1/jobs``); defaults are the server's."""

    model_config = ConfigDict(extra="forbid")

    kind: str = "custom"
    payload: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=lambda: Resources())
    priority: str = "free"
    team: str | None = None
    user: str = "anonymous"
    node_selector: dict[str, str] = Field(default_factory=dict)
    replicas: int = 1
    gang_label: str | None = None
    gang_label_required: bool = False
    model: str | None = None
    models: list[str] = Field(default_factory=list)  # LoRAs, a VAE ...: "lora:<name>"
    backend: str | None = None
    batch_key: str | None = None
    preemptible: bool = True
    timeout_s: float | None = None
    max_attempts: int = 3
    estimated_runtime_s: float | None = None
    idempotency_key: str | None = None
    inputs: list[dict[str, str]] = Field(
        default_factory=list,
        description='uploaded files: [{"blob": sha256, "name": ...}]; other jobs\' results: '
        '[{"from": job id or step, "file": ..., "as": ...}]',
    )
    labels: dict[str, str] = Field(default_factory=dict, description="your own tags")
    webhook: dict[str, str] | None = Field(
        None, description='{"url": ..., "events": "end" | "all"}: called signed on changes'
    )
    after: list[str] = Field(default_factory=list, description="jobs (steps) that must succeed")
    after_any: list[str] = Field(default_factory=list, description="jobs (steps) that must end")

    def body(self) -> dict[str, Any]:
        """The JSON body: only what was set, so the server's defaults apply to the rest."""
        return self.model_dump(mode="json", exclude_unset=True)


class ResourcesStatus(_Out):
    gpus: int
    gpu_milli: int
    vram_bytes: int
    cpus: float
    gpu_models: list[str] = Field(default_factory=list)
    cpu_fallback: bool = False
    memory_bytes: int = 0

    def describe(self) -> str:
        """``"1 GPU"``, ``"0.5 GPU"``, ``"2 GPU × 24GiB"``, or ``"cpu"``."""
        share = self.gpus or self.gpu_milli / 1000
        if not share:
            return f"{self.cpus:g} cpu"
        text = f"{share:g} GPU"
        if self.vram_bytes:
            text += f" × {self.vram_bytes / 2**30:g}GiB"
        if self.gpu_models:
            text += f" ({', '.join(self.gpu_models)})"
        return text


class ResultFile(_Out):
    name: str
    size: int
    content_type: str
    sha256: str
    url: str


class Reason(_Out):
    """One reason a job cannot be placed, and on how many nodes it holds."""

    code: str
    nodes: int
    message: str


class WaitInfo(_Out):
    """Why a queued job waits, from the scheduler's last cycle."""

    position: int
    remedy: str | None = None
    summary: str = ""
    reasons: list[Reason] = Field(default_factory=list)
    advice: str | None = Field(default=None, description="what to do when no node can ever run it")


class Eta(_Out):
    """When a job is expected to start and end (epoch seconds): an estimate the server
    re-makes every few seconds from the queue and the run times of finished jobs."""

    start_at: float | None = None  # queued jobs; None: not foreseen
    end_at: float | None = None
    runtime_s: float = 0.0
    basis: str = ""  # history, estimate, progress, default; beyond or never (no start)
    computed_at: float = 0.0

    def describe(self, now: float, *, running: bool = False) -> str:
        """``"starts in ~4 min"``, ``"ends in ~2 min"`` (``running``), or why neither."""
        if running:
            return "end not foreseen" if self.end_at is None else f"ends {_in(self.end_at - now)}"
        if self.start_at is None:
            return "no node can run it" if self.basis == "never" else "start not foreseen"
        return f"starts {_in(self.start_at - now)}"


def _in(seconds: float) -> str:
    """``"in ~4 min"``: rounded as a person says it; ``"any moment"`` when due or overdue."""
    if seconds < 30:
        return "any moment"
    if seconds < 90:
        return "in ~1 min"
    if seconds < 3600:
        return f"in ~{round(seconds / 60)} min"
    if seconds < 2 * 86_400:
        return f"in ~{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"in ~{round(seconds / 86_400)} days"


class JobStatus(_Out):
    """A job as the server last saw it."""

    id: str
    kind: str
    state: JobState
    priority: str
    team: str
    user: str
    resources: ResourcesStatus
    payload: dict[str, Any] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    replicas: int = 1
    gang_label: str | None = None
    gang_label_required: bool = False
    model: str | None = None
    models: list[str] = Field(default_factory=list)
    backend: str | None = None
    batch_key: str | None = None
    preemptible: bool = True
    timeout_s: float | None = None
    max_attempts: int = 3
    idempotency_key: str | None = None
    submitted_at: float
    not_before: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int = 0
    failures: int = 0
    node: str | None = None
    allocations: list[str] = Field(default_factory=list)
    progress: float = 0.0
    checkpoint: str | None = None
    checkpoint_step: int | None = None  # the step the latest checkpoint holds
    resumed_from_step: int | None = None  # the latest attempt resumed from this step
    error: str | None = None
    # A client interrupted it: ``succeeded`` with what it made so far (partial), or
    # ``cancelled`` when it had made nothing.
    interrupted: bool = False
    # The model and parameters it ran with where the request left them open (the backend's
    # loaded model, a sampler, a drawn seed), as the agent reported them.
    ran: dict[str, str] | None = None
    result: list[ResultFile] = Field(default_factory=list)
    queue: WaitInfo | None = None
    held: bool = False  # queued, but not placed until released
    labels: dict[str, str] = Field(default_factory=dict)
    webhook: dict[str, str] | None = None
    inputs: list[dict[str, str]] = Field(default_factory=list)  # [{blob, name}] it reads
    after: list[dict[str, str]] = Field(default_factory=list)  # [{job, need: ok | any}]
    pipeline: dict[str, Any] | None = None  # {id, step}
    array: dict[str, Any] | None = None  # {id, index}
    eta: Eta | None = None  # expected start (queued) and end; None once it ended

    @property
    def done(self) -> bool:
        """The job has ended (succeeded, failed or cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def outcome(self) -> str:
        """The state as a person reads it: ``interrupted`` for an interrupted job (its
        ``state`` stays ``succeeded`` or ``cancelled``), else the state's name."""
        return "interrupted" if self.interrupted else self.state.value


class JobPage(_Out):
    jobs: list[JobStatus]
    next_cursor: str | None = None


class ResultStatus(_Out):
    id: str
    state: JobState
    error: str | None = None
    files: list[ResultFile] = Field(default_factory=list)


class GpuStatus(_Out):
    index: int
    model: str
    vram_bytes: int
    vram_free_bytes: int | None = None
    utilization: float | None = Field(default=None, description="0..1, as the agent last measured")
    temperature_c: float | None = Field(default=None, description="degrees Celsius, likewise")


class AllocationStatus(_Out):
    id: str
    job_ids: list[str]
    replica: int = 0
    attempt: int = 0
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_milli: int = 0
    vram_bytes: int = 0
    cpus: float = 0
    on_cpu: bool = False
    memory_bytes: int = 0
    borrowed: bool = False
    desired: str = "run"
    observed: str = "pending"
    progress: float = 0.0


class NodeStatus(_Out):
    name: str
    state: str
    paused: bool = False
    draining: bool = False
    schedulable: bool = True
    gpus: list[GpuStatus] = Field(default_factory=list)
    cpus: float = 0
    memory_bytes: int = 0  # host memory it offers to jobs' requests
    labels: dict[str, str] = Field(default_factory=dict)
    models_on_disk: list[str] = Field(default_factory=list)
    models_loaded: list[str] = Field(default_factory=list)
    backends: list[str] = Field(default_factory=list)
    last_seen: float = 0.0
    joined_at: float = 0.0
    allocations: list[AllocationStatus] = Field(default_factory=list)

    @property
    def condition(self) -> str:
        """One word for people: ``lost``, ``draining``, ``paused`` or ``ready``."""
        if self.state != "ready":
            return self.state
        if self.draining:
            return "draining"
        return "paused" if self.paused else "ready"


class TeamQuota(_Out):
    name: str
    quota_gpus: float = 0.0
    borrow_limit_gpus: float | None = None
    weight: float = 1.0


class QueueEntry(_Out):
    job: JobStatus
    position: int
    queue: WaitInfo


class QueueStatus(_Out):
    total: int
    entries: list[QueueEntry] = Field(default_factory=list)


class TokenStatus(_Out):
    id: str
    kind: str
    name: str
    team: str | None = None
    created_at: float = 0.0
    revoked: bool = False


class NewToken(TokenStatus):
    token: str = Field(description="the secret, shown once")
    join: str | None = Field(None, description="agent tokens: what `corral agent --join` takes")
    join_command: str | None = Field(None, description="agent tokens: how a GPU machine joins")


class AuditActor(_Out):
    id: str | None = Field(default=None, description="the token's id; None: the server itself")
    kind: str = Field(description="admin, team, agent or server")
    name: str = ""
    team: str | None = None


class AuditRecord(_Out):
    """One entry of the server's audit log: who did what to what, when, from where."""

    seq: int
    at: float
    actor: AuditActor
    action: str
    target: str
    detail: dict[str, Any] = Field(default_factory=dict)
    address: str | None = None
    forwarded_for: str | None = None


class AuditPage(_Out):
    records: list[AuditRecord]
    next_cursor: str | None = None


class ScalingPool(_Out):
    """A pool the autoscaler can start machines of (``GET /v1/autoscaler``)."""

    name: str
    gpus: int = 0
    gpu_model: str = ""
    vram_bytes: int = 0
    cpus: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    backends: list[str] = Field(default_factory=list)
    min_nodes: int = 0
    max_nodes: int = 0
    cost_per_hour: float = 0.0
    max_spend_per_hour: float | None = None
    provider: str = ""
    fixed: bool = False
    backoff_until: float | None = None
    machines: dict[str, int] = Field(default_factory=dict)  # by state: launching, joined, ...
    cost_per_hour_now: float = 0.0
    spent_last_hour: float = 0.0


class ScalingMember(_Out):
    name: str
    pool: str
    launched_at: float = 0.0


class ScalingMachine(_Out):
    name: str
    pool: str
    state: str  # launching (asked for, not joined), joined, draining, lost, terminating
    launched_at: float = 0.0


class ScalingSpend(_Out):
    cost_per_hour_now: float = 0.0
    spent_last_hour: float = 0.0
    max_spend_per_hour: float | None = None


class ScalingLines(_Out):
    at: float
    lines: list[str] = Field(default_factory=list)


class ScalingDecision(_Out):
    at: float
    members: list[ScalingMember] = Field(default_factory=list)
    launches: list[dict[str, Any]] = Field(default_factory=list)
    drain: list[str] = Field(default_factory=list)
    undrain: list[str] = Field(default_factory=list)
    remove: list[dict[str, Any]] = Field(default_factory=list)
    unmet: list[dict[str, Any]] = Field(default_factory=list)


class AutoscalerStatus(_Out):
    enabled: bool
    pools: list[ScalingPool] = Field(default_factory=list)
    machines: list[ScalingMachine] = Field(default_factory=list)
    spend: ScalingSpend | None = None
    decisions: list[ScalingLines] = Field(default_factory=list)  # recent ones that did something
    last: ScalingDecision | None = None


class DeliveryAttempt(_Out):
    at: float
    status: int | None = None  # the receiver's HTTP status; None: no answer
    error: str | None = None
    ms: float = 0.0


class Delivery(_Out):
    """One webhook call of a job, pipeline or array (``GET /v1/jobs/{id}/deliveries``) and
    its attempts."""

    id: str  # the Corral-Delivery header, the same on every attempt
    subject: str = ""  # the job, pipeline or array it reports on
    subject_kind: str = "job"  # job | pipeline | array
    kind: str  # the event it reports, e.g. job.succeeded
    event_seq: int
    url: str
    state: str  # pending | delivered | failed
    attempts: int
    created_at: float
    next_at: float | None = None
    delivered_at: float | None = None
    last_status: int | None = None
    last_error: str | None = None
    history: list[DeliveryAttempt] = Field(default_factory=list)
    body: dict[str, Any] = Field(default_factory=dict)


class PolicyVersion(_Out):
    """One version of the policy: 0 is the built-in one (none applied yet)."""

    version: int
    applied_by: str
    applied_at: float
    note: str = ""


class PolicyStatus(PolicyVersion):
    """A policy version with its document and how the server reads it."""

    document: str
    policy: dict[str, Any] = Field(default_factory=dict)


class UsageRow(_Out):
    """One group's use; the fields not grouped by are None."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    team: str | None = None
    user: str | None = None
    priority_class: str | None = Field(None, alias="class")
    pool: str | None = None
    day: str | None = None
    hour: str | None = None
    gpu_seconds: float = 0.0
    milli_gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    jobs: int = 0
    cost: float = 0.0


class UsageReport(_Out):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    by: list[str]
    start: float = Field(alias="from")
    end: float = Field(alias="to")
    rows: list[UsageRow]
    total: UsageRow
    truncated: bool = False
