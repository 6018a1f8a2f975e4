"""Fixtures for the attack tests (issue 45): real servers on loopback, SQLite and PostgreSQL.

The server tests' harnesses (``tests/server``: ``http_harness``, ``process_harness``)
are shared, not copied: their directory is put on the import path here.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_BASE = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same attack on SQLite (a temp file) and on PostgreSQL (a fresh schema)."""
    if request.param == "sqlite":
        yield str(tmp_path / "corral.db")
        return
    _require_postgres()
    schema = f"t_sec_{uuid.uuid4().hex[:12]}"
    yield f"{PG_BASE}?schema={schema}"
    _drop_schema(schema)


def _require_postgres() -> None:
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=1):
            return
    except OSError:
        if os.environ.get("CORRAL_REQUIRE_SERVICES") == "1":
            pytest.fail("PostgreSQL is required (CORRAL_REQUIRE_SERVICES=1) but is down")
        pytest.skip("PostgreSQL not running on 127.0.0.1:5432")


def _drop_schema(schema: str) -> None:
    import asyncio

    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres", database="test")
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())
