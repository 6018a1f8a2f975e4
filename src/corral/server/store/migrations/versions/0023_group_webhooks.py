"""A pipeline's or array's own webhook: ``job_groups`` gains ``webhook_url`` and
``webhook_events`` (``end``: one call when every job of the group has ended; ``all``:
also each of its jobs' state changes), delivered by the same loop as a job's.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_groups", sa.Column("webhook_url", sa.String(2048), nullable=True))
    op.add_column("job_groups", sa.Column("webhook_events", sa.String(8), nullable=True))


def downgrade() -> None:
    op.drop_column("job_groups", "webhook_events")
    op.drop_column("job_groups", "webhook_url")
