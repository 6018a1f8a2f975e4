"""What changed in the queue, for the scheduling loop's snapshot on SQLite.

Triggers append the id of every job that enters, changes in or leaves the
``queued`` state to ``job_changes``, in the same transaction as the change.
SQLite has one writer at a time, so a row's ``n`` grows in commit order: a
cycle reads the rows after the last ``n`` it saw and re-reads just those jobs
instead of the version of every queued job (``loops/snapshot.py``). On
PostgreSQL the table stays empty: concurrent writers commit out of ``n``'s
order, and the cycle keeps reading every queued job's version.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TRIGGERS = {
    "jobs_queue_insert": "AFTER INSERT ON jobs WHEN new.state = 'queued' "
    "BEGIN INSERT INTO job_changes (job_id) VALUES (new.id); END",
    "jobs_queue_update": "AFTER UPDATE ON jobs WHEN old.state = 'queued' OR new.state = 'queued' "
    "BEGIN INSERT INTO job_changes (job_id) VALUES (new.id); END",
    "jobs_queue_delete": "AFTER DELETE ON jobs WHEN old.state = 'queued' "
    "BEGIN INSERT INTO job_changes (job_id) VALUES (old.id); END",
}


def upgrade() -> None:
    op.create_table(
        "job_changes",
        sa.Column(
            "n",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("job_id", sa.String(length=40), nullable=False),
    )
    if op.get_bind().dialect.name == "sqlite":
        for name, body in TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("job_changes")
