"""What a job's run was: interrupted or not, and what actually ran.

``interrupted`` marks a job that ended because a client interrupted it (``succeeded``
with what it made, or ``cancelled`` when it made nothing); ``ran`` keeps the model
and parameters the agent filled in or changed (a default checkpoint, a drawn seed),
which were only a log line before.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE, not a batch: a batch copies the jobs table on SQLite, and the copy
    # would lose the queue's triggers (migration 0006).
    op.add_column(
        "jobs", sa.Column("interrupted", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("jobs", sa.Column("ran", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "ran")
    op.drop_column("jobs", "interrupted")
