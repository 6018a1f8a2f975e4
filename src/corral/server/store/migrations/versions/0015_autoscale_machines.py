"""The autoscaler's ledger: every machine it asked a provider for (autoscaler/ledger.py).

Written before the provider is asked, so launches in flight count against
``max_nodes`` and the spend caps while the provider's list lags, and after a
restart or a change of leader.

Revision ID: 0015
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autoscale_machines",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("asked_at", sa.Double(), nullable=False),
        sa.Column("cost_per_hour", sa.Double(), nullable=False),
        sa.Column("sent", sa.Boolean(), nullable=False),
        sa.Column("listed", sa.Boolean(), nullable=False),
        sa.Column("joined", sa.Boolean(), nullable=False),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(512), nullable=False),
    )
    op.create_index("ix_autoscale_machines_ended_at", "autoscale_machines", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_autoscale_machines_ended_at", table_name="autoscale_machines")
    op.drop_table("autoscale_machines")
