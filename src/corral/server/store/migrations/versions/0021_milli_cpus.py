"""Fractional CPUs: an allocation holds CPUs to a milli-CPU (``0.5``, ``11.4``).

The column becomes a double on PostgreSQL, whose integer column would refuse 0.5.
SQLite keeps the declared type (it stores 0.5 as a real in any column): its
table is left as it is, since changing a type there means rebuilding it.

Revision ID: 0021
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("allocations", "cpus", type_=sa.Double(), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "allocations",
            "cpus",
            type_=sa.Integer(),
            existing_nullable=False,
            postgresql_using="ceil(cpus)::integer",
        )
