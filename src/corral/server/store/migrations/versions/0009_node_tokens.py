"""Nodes remember the join token that admitted them (a cap on node names per token).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_id", sa.String(length=64), nullable=True))
        batch_op.create_index("ix_nodes_token_id", ["token_id"])


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index("ix_nodes_token_id")
        batch_op.drop_column("token_id")
