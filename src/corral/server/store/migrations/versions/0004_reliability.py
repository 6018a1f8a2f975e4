"""Checkpoint steps, attempt errors, and nodes paused for failing (issue 8).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint_step", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("resumed_step", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("attempt_errors", sa.JSON(), nullable=True))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("failure_streak", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("pause_reason", sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("pause_reason")
        batch_op.drop_column("failure_streak")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("attempt_errors")
        batch_op.drop_column("resumed_step")
        batch_op.drop_column("checkpoint_step")
