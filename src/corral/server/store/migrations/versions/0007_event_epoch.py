"""A marker that PostgreSQL empties in crash recovery, for event numbers (PostgreSQL only).

``event_epoch`` is UNLOGGED: PostgreSQL truncates such a table when it
recovers from a crash (of the server or of one of its processes) and on a
promoted standby, and keeps it over a clean restart. Relaxed commits
(``synchronous_commit`` off) publish their events before their WAL is
flushed, so a crash may forget them and the ``events`` sequence's advance
with them; an empty marker tells the first writer after recovery to move
the sequence past anything it may have handed out (``events.pg_mark_epoch``).
SQLite servers jump at every start instead and need no table.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE UNLOGGED TABLE event_epoch (marked_at double precision NOT NULL)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TABLE IF EXISTS event_epoch")
