"""Memory requests: an allocation holds host memory (``allocations.memory_bytes``, bytes).

A job's request lives in its spec's resources (``memory_bytes``) as its other resources
do; allocations from before hold none. Plain ``add_column`` with a server default, which
SQLite takes as an ALTER TABLE without rebuilding the table.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "allocations",
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("allocations", "memory_bytes")
