"""Webhooks (signed calls on a job's state changes) and the editable queue's columns.

``jobs`` gains ``held`` (queued but never placed until released), ``queue_at`` (its
place in its user's own queue when moved to the top; None: its submission time) and the
webhook it names (``webhook_url``, ``webhook_events``: ``end`` or ``all``). New tables:
``webhook_deliveries`` (one row per call to make, with its attempts), ``webhook_secrets``
(one HMAC secret per team) and ``webhook_cursor`` (the last event turned into deliveries).

Revision ID: 0020
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain add_column: SQLite keeps the table (and migration 0006's triggers on it).
    op.add_column(
        "jobs", sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("jobs", sa.Column("queue_at", sa.Double(), nullable=True))
    op.add_column("jobs", sa.Column("webhook_url", sa.String(2048), nullable=True))
    op.add_column("jobs", sa.Column("webhook_events", sa.String(8), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("subject", sa.String(40), nullable=False),
        sa.Column("subject_kind", sa.String(16), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("delivered_at", sa.Double(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(512), nullable=True),
        sa.Column("history", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.UniqueConstraint("subject", "event_seq", name="uq_webhook_deliveries_subject_event"),
    )
    op.create_index("ix_webhook_deliveries_state_next", "webhook_deliveries", ["state", "next_at"])
    op.create_index("ix_webhook_deliveries_team_state", "webhook_deliveries", ["team", "state"])
    op.create_table(
        "webhook_secrets",
        sa.Column("team", sa.String(64), primary_key=True),
        sa.Column("secret", sa.String(80), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "webhook_cursor",
        sa.Column("name", sa.String(16), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
    )
    # No job named a webhook before this revision: the events so far need no delivery.
    op.execute(
        "INSERT INTO webhook_cursor (name, seq) SELECT 'events', COALESCE(MAX(seq), 0) FROM events"
    )


def downgrade() -> None:
    op.drop_table("webhook_cursor")
    op.drop_table("webhook_secrets")
    op.drop_index("ix_webhook_deliveries_team_state", "webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_state_next", "webhook_deliveries")
    op.drop_table("webhook_deliveries")
    for column in ("webhook_events", "webhook_url", "queue_at", "held"):
        op.drop_column("jobs", column)
