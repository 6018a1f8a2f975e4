"""What the scheduling leader last said of waiting and running jobs, for other replicas:
``queue_waits`` holds each queued job's place in the order, why it waits and what could
help, and each job's ETA (``loops/waits.py``). Rewritten whole by the leader.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_waits",
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column("position", sa.Integer, nullable=True),
        sa.Column("reasons", sa.Text, nullable=True),
        sa.Column("remedy", sa.String(16), nullable=True),
        sa.Column("eta_start", sa.Double, nullable=True),
        sa.Column("eta_end", sa.Double, nullable=True),
        sa.Column("eta_runtime_s", sa.Double, nullable=True),
        sa.Column("eta_basis", sa.String(16), nullable=True),
        sa.Column("made_at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("queue_waits")
