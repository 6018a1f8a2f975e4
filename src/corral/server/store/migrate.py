"""Run the alembic migrations shipped inside the package, at server start.

``upgrade`` is called with a synchronous connection (through
``AsyncConnection.run_sync``) so alembic runs inside the caller's transaction.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic Config pointing at the packaged scripts, optionally bound to a connection."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(connection: Connection) -> None:
    """Bring the schema on ``connection`` to the newest revision."""
    command.upgrade(alembic_config(connection), "head")
