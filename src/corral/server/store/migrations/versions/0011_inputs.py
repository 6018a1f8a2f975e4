"""Input files: blobs uploaded for jobs to read (``POST /v1/inputs``, ComfyUI's uploads).

``inputs`` has one row per (owner, sha256): the bytes are stored once per content
(``inputs/<sha256>`` in the blob store) however many callers upload them, and each
owner (a team, or the admin) may name only the blobs it uploaded itself.
``input_names`` keeps the file names the drop-in ComfyUI ``/upload/image`` gave out,
so a later ``/prompt`` naming one carries that blob.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inputs",
        sa.Column("owner", sa.String(80), primary_key=True),
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("mime", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("used_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_inputs_used_at", "inputs", ["used_at"])
    op.create_index("ix_inputs_sha256", "inputs", ["sha256"])
    op.create_table(
        "input_names",
        sa.Column("owner", sa.String(80), primary_key=True),
        sa.Column("folder", sa.String(300), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("input_names")
    op.drop_index("ix_inputs_sha256", "inputs")
    op.drop_index("ix_inputs_used_at", "inputs")
    op.drop_table("inputs")
