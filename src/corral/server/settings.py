"""The server's one typed settings tree (STYLE.md habit 10).

Built once in the composition root (``corral server`` or a test) and passed
down; nothing reads the environment at import time. Every field can be set
from the environment with the ``CORRAL_`` prefix and ``__`` for nesting, e.g.
``CORRAL_STORE__DB=postgresql://db/corral`` or ``CORRAL_API__PORT=9000``.

Over 400 lines on purpose: one field per setting, each with the description that
``corral server --help`` and docs/server.md show; sections with rooms of their own live in
``compat_settings``, ``security_settings`` and ``autoscale_settings``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, IPvAnyNetwork, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from corral.server.autoscale_settings import AutoscaleSettings
from corral.server.compat_settings import CompatSettings
from corral.server.security_settings import (
    MIN_ADMIN_TOKEN_CHARS,
    LimitsSettings,
    QuotaSettings,
    TlsSettings,
    weakness,
)
from corral.server.webhook_settings import WebhookSettings

DEFAULT_HOME = Path("~/.corral")
DEFAULT_PORT = 8470
DEFAULT_AGENT_PORT = 8471


class StoreSettings(BaseModel):
    """Where state lives."""

    db: str = Field(
        default="",
        description=(
            "Database URL: a SQLite path or sqlite:///path (default ~/.corral/corral.db), "
            "or postgresql://user@host:port/db (add ?schema=name to use a schema)."
        ),
    )
    sqlite_synchronous: str = Field(
        default="FULL",
        pattern="^(OFF|NORMAL|FULL|EXTRA)$",
        description="SQLite PRAGMA synchronous. FULL survives power loss; NORMAL survives kill -9.",
    )
    sqlite_wal_prefill: bool = Field(
        default=True,
        description=(
            "Zero-fill SQLite's WAL to the size it reaches between checkpoints (16 MB) at "
            "start, so commits overwrite it in place (a cheaper fsync) instead of growing it."
        ),
    )
    pool_size: int = Field(default=10, ge=1, le=200, description="PostgreSQL connections")
    pool_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a request waits for a free PostgreSQL connection before it "
        "fails (SQLAlchemy's default); event streams never take more than "
        "limits.stream_table_readers of them",
    )


class ApiSettings(BaseModel):
    """The HTTP API."""

    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="0 picks a free port")
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="requests larger than this get 413"
    )
    max_batch_jobs: int = Field(default=1000, ge=1, description="jobs in one batch submission")
    sse_poll_s: float = Field(
        default=1.0,
        gt=0,
        description="SSE streams re-read the event table at least this often (other replicas)",
    )
    sse_keepalive_s: float = Field(default=15.0, gt=0, description="comment line when idle")
    history_sample_s: float = Field(
        default=10.0, ge=0.05, description="the dashboard's plots: one sample this often"
    )
    token_cache_s: float = Field(
        default=5.0, ge=0, description="how long a verified token is trusted without a DB read"
    )
    revocation_check_s: float = Field(
        default=1.0,
        gt=0,
        description="how often each replica re-checks the tokens of its open streams and "
        "cached tokens, so a revoked token's streams end this soon even if the replicas' "
        "note is lost (docs/security/revocation.md); one small read per period",
    )
    session_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="a dashboard login (its session cookie) lasts this long; revoking the "
        "token ends it at once",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a request's line and headers must arrive within this long of its first "
        "byte (or of the connection opening), else 408 and close: a client sending them a byte "
        "at a time cannot hold a connection (a real one sends them in one packet)",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="a request body that sends nothing for this long is cut off (408): long "
        "enough for a phone on a bad network, short enough that a stalled upload frees its "
        "connection",
    )
    min_body_bytes_per_s: float = Field(
        default=1000.0,
        ge=0,
        description="once a request body has taken body_timeout_s, it must have averaged at "
        "least this rate, else 408: a body trickled a byte at a time is cut off, while a 56k "
        "modem (7000 bytes/s) passes (0: no minimum)",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=4096,
        description="request line and headers at most this big, else 431 (browsers send a few "
        "KiB; 64 KiB leaves room for large cookies and tokens)",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="open HTTP connections (event streams and websockets included) at most; "
        "more are answered 503 and closed at once. Also never more than half the process's "
        "descriptor limit (ulimit -n), which agents, the database and files share",
    )
    max_connections_per_address: int = Field(
        default=200,
        ge=1,
        description="open HTTP connections from one client address at most; more are answered "
        "503 at once, so one machine cannot take every connection (an office behind one NAT "
        "address still gets 200). A trusted proxy's address (uvicorn's forwarded_allow_ips, "
        "FORWARDED_ALLOW_IPS: 127.0.0.1 by default) is not held to it: it carries many clients",
    )


class SchedulingSettings(BaseModel):
    """The scheduling loop and the liveness loop."""

    debounce_s: float = Field(
        default=0.002,
        ge=0,
        description="cycles start at least this far apart, so a burst of changes is one cycle",
    )
    idle_cycle_s: float = Field(
        default=2.0, gt=0, description="a cycle runs at least this often, even with no trigger"
    )
    explain_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="with more than 256 jobs queued, why each waits is worked out at most "
        "this often; the cycles between only place (0: every cycle; docs/server.md)",
    )
    node_timeout_s: float = Field(
        default=30.0, gt=0, description="a node not heard from for this long is lost"
    )
    liveness_tick_s: float = Field(default=1.0, gt=0, description="how often timeouts are checked")
    min_runtime_before_preemption_s: float = Field(
        default=60.0,
        ge=0,
        description="work that has run less than this is never preempted (no thrashing of "
        "work that just began); the loop wakes when it passes, not at the next idle cycle",
    )
    preemption_grace_s: float = Field(
        default=30.0, ge=0, description="time a preempted allocation gets to checkpoint"
    )
    stop_grace_s: float = Field(default=10.0, ge=0, description="grace for cancel and timeout")
    gang_start_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="a gang replica not started this long after its placement fails the "
        "gang's attempt (the gang is requeued as one)",
    )
    stop_slack_s: float = Field(
        default=30.0,
        ge=0,
        description="after grace + slack without an answer, a stop is taken as done",
    )
    input_move_bytes_per_s: float = Field(
        default=100e6,
        gt=0,
        description="how fast a pipeline step's input files move between machines: a step "
        "waits this long per byte for the machine that made them before going elsewhere",
    )
    retry_backoff_s: float = Field(
        default=2.0, ge=0, description="first retry delay after a retryable failure; doubles"
    )
    max_batch_size: int = Field(default=8, ge=1, description="sample jobs per allocation")
    same_failure_nodes: int = Field(
        default=3,
        ge=0,
        description="a job failing the same way on this many nodes fails for good (0: never)",
    )
    node_failure_pause: int = Field(
        default=5,
        ge=0,
        description="a node whose last this-many jobs failed is paused automatically (0: never)",
    )
    leader_retry_s: float = Field(
        default=1.0,
        gt=0,
        description="a follower replica tries this often to take over the scheduling loop",
    )
    resync_s: float = Field(
        default=5.0,
        gt=0,
        description="assignments and stops unanswered this long are sent again (safety net)",
    )
    preemption: bool = True
    seed: int = Field(default=0, description="seed handed to the scheduler for tie-breaks")


class AgentLinkSettings(BaseModel):
    """The gRPC port agents dial (docs/agent-link.md)."""

    enabled: bool = Field(
        default=True, description="serve the gRPC agent link (off: agents cannot join)"
    )
    host: str | None = Field(default=None, description="address to listen on (default: api.host)")
    port: int = Field(default=DEFAULT_AGENT_PORT, ge=0, le=65535, description="0 picks a free port")
    max_message_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=64 * 1024,
        description="largest stream message; larger results go through chunked uploads",
    )
    max_blob_bytes: int = Field(
        default=512 * 1024 * 1024, ge=1024, description="largest uploaded result blob"
    )
    upload_idle_s: float = Field(
        default=120.0,
        gt=0,
        description="a partial upload with no chunk for this long is dropped and frees its "
        "place under the upload caps; an agent cut off mid-upload dials again within its "
        "backoff (at most 30 s) and resumes well before",
    )
    max_uploads_per_node: int = Field(
        default=8,
        ge=1,
        description="unfinished uploads one node may have at once (more get RESOURCE_EXHAUSTED "
        "until one completes or idles out): an agent uploads one blob at a time, so the rest "
        "are uploads cut off and waiting to resume",
    )
    max_uploads: int = Field(
        default=1024,
        ge=1,
        description="unfinished uploads on this server at once, of all nodes: each keeps a "
        "hash state in memory and up to max_blob_bytes of scratch disk (no open file)",
    )
    max_nodes_per_token: int = Field(
        default=10_000,
        ge=1,
        description="node names one join token may hold; at the cap a new name replaces the "
        "token's longest-lost node, and is refused while all of its nodes are live (a fleet "
        "of thousands fits; a leaked token cannot grow the node table without bound)",
    )
    hello_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="an agent must connect (TCP, TLS and HTTP/2 handshakes) and say hello "
        "this soon; a connection that does not is closed",
    )
    max_connections: int = Field(
        default=5000,
        ge=1,
        description="connections the agent port accepts at once; more are closed at once "
        "(each agent holds one; keep it below the process's open-file limit, ulimit -n)",
    )
    max_streams_per_connection: int = Field(
        default=16,
        ge=2,
        description="calls open at once on one connection (an agent's stream, an upload, "
        "checkpoint downloads: two or three); more are refused (UNAVAILABLE)",
    )
    idle_connection_s: float = Field(
        default=60.0,
        gt=0,
        description="a connection with no call open this long is closed (an agent always has "
        "its stream open)",
    )
    min_ping_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="keepalive pings closer together than this are misbehaviour; the third "
        "ends the connection (too_many_pings). Agents ping every 20 s",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate for this port only (default: the tls one)"
    )
    tls_key: Path | None = Field(default=None, description="PEM private key for tls_cert")


class ModelRegistrySettings(BaseModel):
    """The model registry, the files it serves, and model-aware routing (docs/models.md)."""

    dir: Path | None = Field(default=None, description="uploaded models (default <home>/models)")
    public_url: str | None = Field(
        default=None,
        description="base URL agents fetch the server's model files from "
        "(default: the host they dial, on the API port)",
    )
    source_schemes: list[str] = Field(
        default_factory=lambda: ["https", "http", "file"],
        description="the kinds of source a model may be registered with ('upload' is always "
        "allowed; file: a file on the server, also limited by file_dirs). Every token can "
        "download what the registry names, so drop 'file' to publish uploads only",
    )
    file_dirs: list[Path] = Field(
        default_factory=list,
        description="directories a file source must be in (symlinks resolved, checked again "
        "at each download); empty: the model directory (dir) only, so no other server file "
        "(/etc/passwd, the database) can be published",
    )
    allowed_networks: list[IPvAnyNetwork] = Field(
        default_factory=list,
        description="private, loopback, link-local or reserved networks an http(s) source may "
        "still point into, e.g. ['192.168.1.0/24'] for a NAS; others are refused, so agents "
        "are never sent to a cloud metadata service (169.254.169.254) or the server's own ports",
    )
    routing: bool = Field(
        default=True, description="weigh a model's download and load time against waiting"
    )
    fetch_bytes_per_s: float = Field(
        default=50e6, gt=0, description="a node's expected download rate, for routing (50 MB/s)"
    )
    load_bytes_per_s: float = Field(
        default=1e9, gt=0, description="disk to GPU memory, for routing (1 GB/s)"
    )
    max_wait_s: float = Field(
        default=300.0, ge=0, description="a job waits at most this long for a node with its model"
    )
    prefetch: bool = Field(default=True, description="copy popular models to idle nodes early")
    prefetch_interval_s: float = Field(
        default=10.0, gt=0, description="how often the prefetch policy runs (at most)"
    )


class InputSettings(BaseModel):
    """Files clients upload for their jobs to read (docs/server.md, "Input files")."""

    max_bytes: int = Field(
        default=64 * 1024**2,
        ge=1024,
        description="one uploaded file at most (a large PNG is tens of MB); larger get 413",
    )
    max_files: int = Field(
        default=1000, ge=1, description="input files one team (or the admin) holds at once"
    )
    max_stored_bytes: int = Field(
        default=4 * 1024**3, ge=1024, description="bytes of input files one team holds at once"
    )
    max_per_job: int = Field(default=16, ge=1, le=256, description="input files one job names")
    retention_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="a file neither uploaded again nor named by a new job for this long is "
        "deleted (never while a job that has not ended names it)",
    )


class RetentionSettings(BaseModel):
    """What the server deletes, and when (docs/server.md, "Retention")."""

    finished_jobs_s: float = Field(
        default=30 * 86400.0,
        ge=0,
        description="finished jobs (succeeded, failed, cancelled) are deleted this long after "
        "they ended, with their events, allocations, results and previews (0: keep forever)",
    )
    previews_s: float = Field(
        default=3600.0,
        ge=0,
        description="a finished job's preview images, and its progress and preview events, "
        "are deleted this long after it ended (0: keep them as long as the job)",
    )
    previews_per_job: int = Field(
        default=100,
        ge=0,
        description="a job keeps its latest previews only: older ones are deleted as new ones "
        "arrive (0: no limit)",
    )
    audit_s: float = Field(
        default=365 * 86400.0,
        ge=0,
        description="audit records (who did what, docs/security/audit.md) are deleted this "
        "long after they were made: a year, the span audits and incident reviews look back "
        "over (0: keep forever)",
    )
    sweep_s: float = Field(default=300.0, gt=0, description="how often the sweep runs")
    batch: int = Field(
        default=500, ge=1, le=10_000, description="jobs deleted per transaction by the sweep"
    )


class Settings(BaseSettings):
    """Everything ``corral server`` can be told."""

    model_config = SettingsConfigDict(  # errors never echo a value: some are secrets
        env_prefix="CORRAL_", env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    home: Path = Field(default=DEFAULT_HOME, description="default place for the DB and blobs")
    blob_dir: Path | None = Field(
        default=None, description="results and previews (default <home>/blobs)"
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="use this admin token instead of generating one at first start; it is "
        "then the only admin token (any other is revoked at start), and it must be strong "
        f"(at least {MIN_ADMIN_TOKEN_CHARS} characters, not a repeated pattern)",
    )
    log_level: str = Field(default="info", pattern="^(debug|info|warning|error)$")
    store: StoreSettings = Field(default_factory=StoreSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)  # docs/security/limits.md
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    agents: AgentLinkSettings = Field(default_factory=AgentLinkSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    models: ModelRegistrySettings = Field(default_factory=ModelRegistrySettings)
    compat: CompatSettings = Field(default_factory=CompatSettings)  # docs/compat.md
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    inputs: InputSettings = Field(default_factory=InputSettings)
    autoscale: AutoscaleSettings = Field(default_factory=AutoscaleSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)  # docs/server.md

    @field_validator("admin_token")
    @classmethod
    def _strong(cls, value: SecretStr | None) -> SecretStr | None:
        problem = value and weakness(value.get_secret_value())
        if problem:
            raise ValueError(
                f"the admin token (admin_token, CORRAL_ADMIN_TOKEN) is too weak: {problem}. "
                "Make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    def resolved_home(self) -> Path:
        return self.home.expanduser()

    def db_url(self) -> str:
        """The DB URL as given, or the default SQLite file under ``home``."""
        return self.store.db or str(self.resolved_home() / "corral.db")

    def blob_path(self) -> Path:
        return (self.blob_dir or self.resolved_home() / "blobs").expanduser()

    def model_path(self) -> Path:
        return (self.models.dir or self.resolved_home() / "models").expanduser()
