"""Usage per hour, team, user, class and node pool, added to as allocations end
(services/usage.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_hours",
        sa.Column("hour", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("team", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(128), primary_key=True),
        sa.Column("priority", sa.String(64), primary_key=True),
        sa.Column("pool", sa.String(64), primary_key=True),
        sa.Column("gpu_milli_s", sa.Double(), nullable=False),
        sa.Column("cpu_s", sa.Double(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("cost", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_hours")
