"""The initial tables (see corral.server.store.tables).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "allocations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_ids", sa.JSON(), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("priority", sa.String(length=64), nullable=False),
        sa.Column("replica", sa.Integer(), nullable=False),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("vram_bytes", sa.BigInteger(), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("on_cpu", sa.Boolean(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("borrowed", sa.Boolean(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("last_checkpoint_at", sa.Double(), nullable=True),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("desired", sa.String(length=16), nullable=False),
        sa.Column("observed", sa.String(length=16), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("stop_reason", sa.String(length=16), nullable=True),
        sa.Column("stop_at", sa.Double(), nullable=True),
        sa.Column("stop_grace_s", sa.Double(), nullable=True),
        sa.Column("deadline_at", sa.Double(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.create_index("ix_allocations_active_node", ["active", "node"], unique=False)

    op.create_table(
        "events",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        sa.Column("node", sa.String(length=255), nullable=True),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_job_seq", ["job_id", "seq"], unique=False)

    op.create_table(
        "jobs",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_s", sa.Double(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("not_before", sa.Double(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("allocation_ids", sa.JSON(), nullable=True),
        sa.Column("node", sa.String(length=255), nullable=True),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("checkpoint", sa.String(length=1024), nullable=True),
        sa.Column("stop_request", sa.String(length=16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
        sa.UniqueConstraint("team", "idempotency_key", name="uq_jobs_team_idempotency_key"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_state_seq", ["state", "seq"], unique=False)
        batch_op.create_index("ix_jobs_team_seq", ["team", "seq"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("inventory", sa.JSON(), nullable=False),
        sa.Column("joined_at", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "teams",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("quota_gpus", sa.Double(), nullable=False),
        sa.Column("borrow_limit_gpus", sa.Double(), nullable=True),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("hash"),
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_table("teams")
    op.drop_table("nodes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_team_seq")
        batch_op.drop_index("ix_jobs_state_seq")

    op.drop_table("jobs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_job_seq")

    op.drop_table("events")
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_index("ix_allocations_active_node")

    op.drop_table("allocations")
