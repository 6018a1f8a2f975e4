"""The tables. The alembic migrations in ``migrations/`` create exactly these.

Conventions: times are epoch seconds (float); structured values are JSON;
every mutable row has a ``version`` that guarded updates compare and bump
(STYLE.md habit 3), so a stale writer changes nothing instead of clobbering.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY, not a BIGINT one.
BigSerial = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("seq", BigSerial, primary_key=True, autoincrement=True),  # submit order, cursors
    sa.Column("id", sa.String(40), nullable=False, unique=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("priority", sa.String(64), nullable=False),
    sa.Column("team", sa.String(64), nullable=False),
    sa.Column("user", sa.String(128), nullable=False),
    sa.Column("spec", sa.JSON, nullable=False),  # resources, selector, payload, ... (see convert)
    sa.Column("replicas", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("timeout_s", sa.Double, nullable=True),
    sa.Column("idempotency_key", sa.String(255), nullable=True),
    sa.Column("request_hash", sa.String(64), nullable=True),
    sa.Column("submitted_at", sa.Double, nullable=False),
    sa.Column("not_before", sa.Double, nullable=False, default=0.0),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),  # of the latest allocation
    sa.Column("failures", sa.Integer, nullable=False, default=0),  # count against max_attempts
    sa.Column("allocation_ids", sa.JSON, nullable=True),  # current ones (a gang has several)
    sa.Column("node", sa.String(255), nullable=True),
    sa.Column("started_at", sa.Double, nullable=True),
    sa.Column("finished_at", sa.Double, nullable=True),
    sa.Column("progress", sa.Double, nullable=False, default=0.0),
    sa.Column("checkpoint", sa.String(1024), nullable=True),  # last reported, resumed from
    sa.Column("checkpoint_step", sa.BigInteger, nullable=True),  # the step it holds
    sa.Column("resumed_step", sa.BigInteger, nullable=True),  # the latest attempt started here
    sa.Column("attempt_errors", sa.JSON, nullable=True),  # [{attempt, node, error, at}, ...]
    sa.Column("stop_request", sa.String(16), nullable=True),  # cancel | interrupt asked for
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("result", sa.JSON, nullable=True),  # list of result blob descriptors
    sa.Column("version", sa.Integer, nullable=False, default=1),
    # Migration 0010: ended because a client interrupted it; what the agent filled in.
    sa.Column("interrupted", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    sa.Column("ran", sa.JSON, nullable=True),  # {"model": ..., "seed": ...} as it ran
    # Migration 0020: the editable queue (held: queued, never placed until released;
    # queue_at: its place in its user's own queue once moved to the top) and its webhook.
    sa.Column("held", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    sa.Column("queue_at", sa.Double, nullable=True),
    sa.Column("webhook_url", sa.String(2048), nullable=True),
    sa.Column("webhook_events", sa.String(8), nullable=True),  # end | all
    # Migration 0019: the pipeline or array it belongs to, and its step name or index there.
    sa.Column("group_id", sa.String(40), nullable=True),
    sa.Column("member", sa.String(64), nullable=True),
    # Migration 0022: the model it asks for (also in spec), for the jobs list's filter.
    sa.Column("model", sa.String(255), nullable=True),
    sa.UniqueConstraint("team", "idempotency_key", name="uq_jobs_team_idempotency_key"),
    # The jobs list's filters, each a page read from an index (store/job_search.py).
    sa.Index("ix_jobs_state_seq", "state", "seq"),
    sa.Index("ix_jobs_team_seq", "team", "seq"),
    sa.Index("ix_jobs_group_id", "group_id"),
    sa.Index("ix_jobs_user_seq", "user", "seq"),
    sa.Index("ix_jobs_node_seq", "node", "seq"),
    sa.Index("ix_jobs_model_seq", "model", "seq"),
)

# SQLite only: triggers (migration 0006) append each job entering, changing in or leaving
# the queue, in commit order, so the scheduling loop re-reads just those (loops/changes.py).
job_changes = sa.Table(
    "job_changes",
    metadata,
    sa.Column("n", BigSerial, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(40), nullable=False),
)

allocations = sa.Table(
    "allocations",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("job_ids", sa.JSON, nullable=False),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("team", sa.String(64), nullable=False),
    sa.Column("user", sa.String(128), nullable=False),
    sa.Column("priority", sa.String(64), nullable=False),
    sa.Column("replica", sa.Integer, nullable=False, default=0),
    sa.Column("gpu_indices", sa.JSON, nullable=False),
    sa.Column("gpu_milli", sa.Integer, nullable=False, default=0),
    sa.Column("vram_bytes", sa.BigInteger, nullable=False, default=0),
    sa.Column("cpus", sa.Double, nullable=False, default=0),  # to a milli-CPU
    sa.Column("on_cpu", sa.Boolean, nullable=False, default=False),
    # Migration 0024: host memory it holds, bytes (the job's ``resources.memory``).
    sa.Column("memory_bytes", sa.BigInteger, nullable=False, default=0, server_default="0"),
    sa.Column("preemptible", sa.Boolean, nullable=False, default=True),
    sa.Column("borrowed", sa.Boolean, nullable=False, default=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double, nullable=True),
    sa.Column("ended_at", sa.Double, nullable=True),
    sa.Column("last_checkpoint_at", sa.Double, nullable=True),
    sa.Column("progress", sa.Double, nullable=False, default=0.0),
    sa.Column("desired", sa.String(16), nullable=False),
    sa.Column("observed", sa.String(16), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False),  # observed in (pending, ready, running)
    sa.Column("stop_reason", sa.String(16), nullable=True),
    sa.Column("stop_at", sa.Double, nullable=True),  # when the stop was sent
    sa.Column("stop_grace_s", sa.Double, nullable=True),
    sa.Column("deadline_at", sa.Double, nullable=True),  # started_at + the jobs' timeout
    sa.Column("expected_end_at", sa.Double, nullable=True),  # started_at + estimated run time
    sa.Column("version", sa.Integer, nullable=False, default=1),
    sa.Index("ix_allocations_active_node", "active", "node"),
)

nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("paused", sa.Boolean, nullable=False, default=False),
    sa.Column("draining", sa.Boolean, nullable=False, default=False),
    sa.Column("inventory", sa.JSON, nullable=False),  # gpus, cpus, labels, models, backends
    sa.Column("joined_at", sa.Double, nullable=False),
    sa.Column("last_seen", sa.Double, nullable=False),
    sa.Column("failure_streak", sa.Integer, nullable=False, default=0),  # failed jobs in a row
    sa.Column("pause_reason", sa.String(512), nullable=True),  # why it was paused automatically
    sa.Column("key_hash", sa.String(64), nullable=True),  # sha256 of the agent's node key
    # Migration 0022: each GPU's latest figures from heartbeats (free VRAM, utilisation,
    # temperature), apart from the inventory: written with last_seen, no version bump.
    sa.Column("gpu_live", sa.JSON, nullable=True),
    sa.Column("token_id", sa.String(64), nullable=True),  # the join token that admitted it
    sa.Column("version", sa.Integer, nullable=False, default=1),
    sa.Index("ix_nodes_token_id", "token_id"),
)

teams = sa.Table(
    "teams",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("quota_gpus", sa.Double, nullable=False, default=0.0),
    sa.Column("borrow_limit_gpus", sa.Double, nullable=True),
    sa.Column("weight", sa.Double, nullable=False, default=1.0),
    sa.Column("updated_at", sa.Double, nullable=False),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),  # admin | team | agent
    sa.Column("team", sa.String(64), nullable=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False, unique=True),  # sha256 of the secret
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("revoked_at", sa.Double, nullable=True),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("seq", BigSerial, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("job_id", sa.String(40), nullable=True),
    sa.Column("node", sa.String(255), nullable=True),
    sa.Column("team", sa.String(64), nullable=True),  # lets team tokens read their events
    sa.Column("data", sa.JSON, nullable=False),
    sa.Index("ix_events_job_seq", "job_id", "seq"),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),  # the registry name jobs use
    sa.Column("kind", sa.String(16), nullable=False),  # checkpoint | lora | vae | ...
    sa.Column("backend", sa.String(64), nullable=False),  # "" when any backend can use it
    sa.Column("size", sa.BigInteger, nullable=False),  # exact bytes
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("sources", sa.JSON, nullable=False),  # as registered: URLs, a server file, "upload"
    sa.Column("state", sa.String(16), nullable=False),  # ready | uploading
    sa.Column("server_file", sa.String(1024), nullable=True),  # a file the server serves
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("version", sa.Integer, nullable=False, default=1),
)

# The audit log (migration 0008): one row per admin action, never updated (a trigger refuses
# it); deleted only by the retention sweep after ``retention.audit_s`` (services/audit.py).
audit = sa.Table(
    "audit",
    metadata,
    sa.Column("seq", BigSerial, primary_key=True, autoincrement=True),  # order, cursors
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("actor_id", sa.String(40), nullable=True),  # the token's id; None: the server
    sa.Column("actor_kind", sa.String(16), nullable=False),  # admin | team | agent | server
    sa.Column("actor_name", sa.String(128), nullable=False),
    sa.Column("actor_team", sa.String(64), nullable=True),
    sa.Column("action", sa.String(64), nullable=False),  # e.g. token.create, job.cancel
    sa.Column("target", sa.String(255), nullable=False),  # what it was done to
    sa.Column("detail", sa.JSON, nullable=False),  # a few fields, e.g. a team's new quota
    sa.Column("address", sa.String(64), nullable=True),  # the client's address
    sa.Column("forwarded_for", sa.String(255), nullable=True),  # X-Forwarded-For as sent
    sa.Index("ix_audit_at", "at"),
    sa.Index("ix_audit_actor_seq", "actor_id", "seq"),
)

# Migration 0015: every machine the autoscaler asked a provider for, written before it asks,
# so launches in flight count against max_nodes and the spend caps across restarts and
# leaders (autoscaler/ledger.py). Ended rows are kept a day for the spend figures.
autoscale_machines = sa.Table(
    "autoscale_machines",
    metadata,
    sa.Column("name", sa.String(255), primary_key=True),  # the node name its agent joins as
    sa.Column("pool", sa.String(64), nullable=False),
    sa.Column("provider", sa.String(64), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=False),  # the launch call's, sent again
    sa.Column("asked_at", sa.Double, nullable=False),
    sa.Column("cost_per_hour", sa.Double, nullable=False),
    sa.Column("sent", sa.Boolean, nullable=False, default=False),  # the provider accepted it
    sa.Column("listed", sa.Boolean, nullable=False, default=False),  # the provider listed it
    sa.Column("joined", sa.Boolean, nullable=False, default=False),  # its agent joined
    sa.Column("ended_at", sa.Double, nullable=True),
    sa.Column("outcome", sa.String(16), nullable=False, default=""),  # ledger.Outcome
    sa.Column("reason", sa.String(512), nullable=False, default=""),
    sa.Index("ix_autoscale_machines_ended_at", "ended_at"),
)

# Input files (migration 0011): one row per owner and content; the bytes are stored once
# per content under ``inputs/<sha256>`` (services/inputs.py).
inputs = sa.Table(
    "inputs",
    metadata,
    sa.Column("owner", sa.String(80), primary_key=True),  # "team:<name>" or "admin"
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("name", sa.String(255), nullable=False),  # as first uploaded
    sa.Column("mime", sa.String(128), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("used_at", sa.Double, nullable=False),  # last uploaded or named by a job
    sa.Index("ix_inputs_used_at", "used_at"),
    sa.Index("ix_inputs_sha256", "sha256"),
)

# The names the drop-in ComfyUI ``/upload/image`` handed out: ``folder`` is
# ``<type>/<subfolder>`` as ComfyUI's upload folders are.
input_names = sa.Table(
    "input_names",
    metadata,
    sa.Column("owner", sa.String(80), primary_key=True),
    sa.Column("folder", sa.String(300), primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# Webhooks (migration 0020): one row per call to make (an event of a subject, a job for
# now), its attempts in ``history``; deleted with its job (services/webhooks.py).
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("subject", sa.String(40), nullable=False),  # the job (or array, pipeline) id
    sa.Column("subject_kind", sa.String(16), nullable=False),  # job | pipeline | array
    sa.Column("team", sa.String(64), nullable=False),
    sa.Column("event_seq", sa.BigInteger, nullable=False),  # the event it reports
    sa.Column("kind", sa.String(32), nullable=False),  # the event's kind, e.g. job.succeeded
    sa.Column("url", sa.String(2048), nullable=False),
    sa.Column("body", sa.Text, nullable=False),  # the JSON sent, byte for byte each attempt
    sa.Column("state", sa.String(16), nullable=False),  # pending | delivered | failed
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("next_at", sa.Double, nullable=False),  # due (or leased by a sender until)
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("delivered_at", sa.Double, nullable=True),
    sa.Column("last_status", sa.Integer, nullable=True),  # the receiver's HTTP status
    sa.Column("last_error", sa.String(512), nullable=True),
    sa.Column("history", sa.JSON, nullable=False),  # the latest attempts: at, status, error
    sa.Column("version", sa.Integer, nullable=False, default=1),
    sa.UniqueConstraint("subject", "event_seq", name="uq_webhook_deliveries_subject_event"),
    sa.Index("ix_webhook_deliveries_state_next", "state", "next_at"),
    sa.Index("ix_webhook_deliveries_team_state", "team", "state"),
)

# One HMAC-SHA256 secret per team signs its webhooks; kept readable (signing needs it).
webhook_secrets = sa.Table(
    "webhook_secrets",
    metadata,
    sa.Column("team", sa.String(64), primary_key=True),
    sa.Column("secret", sa.String(80), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# The last event turned into deliveries: moved in the transaction that inserts them.
webhook_cursor = sa.Table(
    "webhook_cursor",
    metadata,
    sa.Column("name", sa.String(16), primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

# Migration 0016: every policy document applied (services/policy.py), kept whole with who
# applied it and when, so history and rollback need nothing else. The highest version is
# the one in force on every replica.
policies = sa.Table(
    "policies",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("document", sa.Text, nullable=False),
    sa.Column("applied_by", sa.String(128), nullable=False),  # the token's name
    sa.Column("applied_at", sa.Double, nullable=False),
    sa.Column("note", sa.String(512), nullable=False, default=""),  # e.g. "rollback to 3"
)

# Migration 0017: resources used per hour, team, user, class and node pool, added to as
# allocations end (services/usage.py). An hour is ``floor(epoch seconds / 3600)``: fine
# enough for a day's chart, and days and months are sums of whole hours.
usage_hours = sa.Table(
    "usage_hours",
    metadata,
    sa.Column("hour", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("team", sa.String(64), primary_key=True),
    sa.Column("user", sa.String(128), primary_key=True),
    sa.Column("priority", sa.String(64), primary_key=True),
    sa.Column("pool", sa.String(64), primary_key=True),  # "" : machines of no pool
    sa.Column("gpu_milli_s", sa.Double, nullable=False, default=0.0),  # milli-GPU-seconds
    sa.Column("cpu_s", sa.Double, nullable=False, default=0.0),
    sa.Column("jobs", sa.Integer, nullable=False, default=0),  # job attempts that ended
    sa.Column("cost", sa.Double, nullable=False, default=0.0),
)

# Pipelines and job arrays (migration 0019, services/pipelines.py): one row per group of
# jobs submitted together; its jobs carry its id in ``jobs.group_id``.
job_groups = sa.Table(
    "job_groups",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),  # "pipeline" | "array"
    sa.Column("team", sa.String(64), nullable=False),
    sa.Column("user", sa.String(128), nullable=False),
    sa.Column("size", sa.Integer, nullable=False),  # how many jobs it holds
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("webhook_url", sa.String(2048), nullable=True),  # its own webhook (0023)
    sa.Column("webhook_events", sa.String(8), nullable=True),  # end | all
    sa.Index("ix_job_groups_team_created", "team", "created_at"),
)

# What a waiting job still waits for (migration 0019, services/dependencies.py): a row per
# job it runs after; the rows go when it enters the queue or is cancelled, so the table holds
# only the dependencies still open and the release pass reads it whole.
job_deps = sa.Table(
    "job_deps",
    metadata,
    sa.Column("job_id", sa.String(40), primary_key=True),  # the waiting job
    sa.Column("dep_id", sa.String(40), primary_key=True),  # a job it runs after
    sa.Column("need", sa.String(8), nullable=False),  # "ok": succeeded; "any": ended at all
    # "near": not a dependency but a queued job held on node ``dep_id`` until ``until``.
    sa.Column("until", sa.Double, nullable=True),
    sa.Index("ix_job_deps_dep_id", "dep_id"),
)

# What the scheduling leader last said of waiting and running jobs (migration 0025,
# loops/waits.py): each queued job's place in the order, why it waits (JSON list of
# [code, nodes, message]) and its remedy; each job's ETA. Rewritten whole by the leader a
# few times a minute so that every replica answers as the leader would.
queue_waits = sa.Table(
    "queue_waits",
    metadata,
    sa.Column("job_id", sa.String(40), primary_key=True),
    sa.Column("position", sa.Integer, nullable=True),  # None: not left unplaced by a cycle
    sa.Column("reasons", sa.Text, nullable=True),
    sa.Column("remedy", sa.String(16), nullable=True),
    sa.Column("eta_start", sa.Double, nullable=True),
    sa.Column("eta_end", sa.Double, nullable=True),
    sa.Column("eta_runtime_s", sa.Double, nullable=True),  # None: no ETA
    sa.Column("eta_basis", sa.String(16), nullable=True),
    sa.Column("made_at", sa.Double, nullable=False),  # when the ETA was made
)
