"""The jobs list's filters served by indexes: a job's model in its own column, and
indexes on (user, seq), (node, seq) and (model, seq); and each node's live GPU figures.

Without them a filter on a user, node or model that few jobs match walked the whole
table newest first: 20-110 ms at 100,000 jobs on SQLite (``bench/job_list.py``); with
them each page reads its 50 rows from the index, as the state and team filters do.

``nodes.gpu_live``: the figures each heartbeat carries (free VRAM, utilisation,
temperature), which only the hello's inventory recorded before. A column of their own,
written with ``last_seen``, so a heartbeat neither rewrites the inventory (racing a
hello) nor bumps the node's version (which tells the scheduler the node changed).

Revision ID: 0022
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE, not a batch: a batch copies the jobs table on SQLite, and the copy
    # would lose the queue's triggers (migration 0006).
    op.add_column("jobs", sa.Column("model", sa.String(255), nullable=True))
    model = (
        "spec ->> 'model'"
        if op.get_bind().dialect.name == "postgresql"
        else "json_extract(spec, '$.model')"
    )
    op.execute(f"UPDATE jobs SET model = {model}")
    op.create_index("ix_jobs_user_seq", "jobs", ["user", "seq"])
    op.create_index("ix_jobs_node_seq", "jobs", ["node", "seq"])
    op.create_index("ix_jobs_model_seq", "jobs", ["model", "seq"])
    op.add_column("nodes", sa.Column("gpu_live", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "gpu_live")
    op.drop_index("ix_jobs_model_seq", "jobs")
    op.drop_index("ix_jobs_node_seq", "jobs")
    op.drop_index("ix_jobs_user_seq", "jobs")
    op.drop_column("jobs", "model")
