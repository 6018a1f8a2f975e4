"""The audit log (issue 45, item 12): who did what, when and from where.

One row per admin action (and per refused one), written in the same
transaction as the change it records. Rows are never changed: a trigger
refuses every UPDATE on both databases. Only the retention sweep deletes
them (``retention.audit_s``); no API route does, so no token can erase one.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

REFUSAL = "audit records are append-only"
SQLITE_TRIGGER = (
    "CREATE TRIGGER audit_append_only BEFORE UPDATE ON audit "
    f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
)
PG_FUNCTION = (
    "CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS "
    f"$$ BEGIN RAISE EXCEPTION '{REFUSAL}'; END $$"
)
PG_TRIGGER = (
    "CREATE TRIGGER audit_append_only BEFORE UPDATE ON audit "
    "FOR EACH ROW EXECUTE FUNCTION audit_append_only()"
)


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("actor_id", sa.String(length=40), nullable=True),
        sa.Column("actor_kind", sa.String(length=16), nullable=False),
        sa.Column("actor_name", sa.String(length=128), nullable=False),
        sa.Column("actor_team", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("forwarded_for", sa.String(length=255), nullable=True),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_actor_seq", "audit", ["actor_id", "seq"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
    else:
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_append_only ON audit")
        op.execute("DROP FUNCTION IF EXISTS audit_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_append_only")
    op.drop_index("ix_audit_actor_seq", table_name="audit")
    op.drop_index("ix_audit_at", table_name="audit")
    op.drop_table("audit")
