"""Policy documents: every version applied, with who applied it and when (services/policy.py).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policies",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("applied_by", sa.String(128), nullable=False),
        sa.Column("applied_at", sa.Double(), nullable=False),
        sa.Column("note", sa.String(512), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("policies")
