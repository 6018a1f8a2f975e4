"""Alembic environment: always runs on the connection the server hands in."""

from __future__ import annotations

from alembic import context

from corral.server.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("corral runs its migrations itself, at server start (Database.prepare)")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
