"""Pipelines and job arrays: jobs that wait for others, and groups submitted as one.

``jobs.group_id`` and ``jobs.member`` name the pipeline (or array) a job belongs to
and its step name (or index) there; ``job_groups`` holds one row per group;
``job_deps`` the dependencies still open of each waiting job (services/dependencies.py).

Revision ID: 0019
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("group_id", sa.String(40), nullable=True))
    op.add_column("jobs", sa.Column("member", sa.String(64), nullable=True))
    op.create_index("ix_jobs_group_id", "jobs", ["group_id"])
    op.create_table(
        "job_groups",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_job_groups_team_created", "job_groups", ["team", "created_at"])
    op.create_table(
        "job_deps",
        sa.Column("job_id", sa.String(40), primary_key=True),
        sa.Column("dep_id", sa.String(40), primary_key=True),
        sa.Column("need", sa.String(8), nullable=False),
        sa.Column("until", sa.Double(), nullable=True),
    )
    op.create_index("ix_job_deps_dep_id", "job_deps", ["dep_id"])


def downgrade() -> None:
    op.drop_index("ix_job_deps_dep_id", "job_deps")
    op.drop_table("job_deps")
    op.drop_index("ix_job_groups_team_created", "job_groups")
    op.drop_table("job_groups")
    op.drop_index("ix_jobs_group_id", "jobs")
    op.drop_column("jobs", "member")  # plain: a batch copy of ``jobs`` would drop its triggers
    op.drop_column("jobs", "group_id")
