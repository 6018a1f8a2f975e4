"""Fixtures for the server tests: a database on SQLite *and* PostgreSQL, and a World.

Every store-backed test runs twice (``[sqlite]`` and ``[postgres]``). Each
PostgreSQL run gets a fresh schema in the ``test`` database, dropped at the
end, so parallel runs never clash. Without PostgreSQL those runs skip, or
fail when ``CORRAL_REQUIRE_SERVICES=1`` (CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from process_harness import ServerProcess
from server_harness import World

PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_BASE = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def postgres_up() -> bool:
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=1):
            return True
    except OSError:
        return False


def require_postgres() -> None:
    if postgres_up():
        return
    if os.environ.get("CORRAL_REQUIRE_SERVICES") == "1":
        pytest.fail("PostgreSQL is required (CORRAL_REQUIRE_SERVICES=1) but 127.0.0.1:5432 is down")
    pytest.skip("PostgreSQL not running on 127.0.0.1:5432")


def drop_schema(schema: str) -> None:
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres", database="test")
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL with a schema of its own, dropped afterwards."""
    require_postgres()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_BASE}?schema={schema}"
    drop_schema(schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on SQLite (a temp file) and on PostgreSQL (a fresh schema)."""
    if request.param == "sqlite":
        yield str(tmp_path / "corral.db")
        return
    require_postgres()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_BASE}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
async def world(db_url: str, tmp_path: Path) -> AsyncIterator[World]:
    """A control plane on a virtual clock with the in-process link; loops are driven by hand."""
    async with _world_on(db_url, tmp_path) as w:
        yield w


@pytest.fixture
async def pg_world(pg_url: str, tmp_path: Path) -> AsyncIterator[World]:
    """``world`` on PostgreSQL alone (what only replicas do: leadership, other writers)."""
    async with _world_on(pg_url, tmp_path) as w:
        yield w


@contextlib.asynccontextmanager
async def _world_on(url: str, tmp_path: Path) -> AsyncIterator[World]:
    w = await World.open(url, tmp_path)
    try:
        yield w
    finally:
        await w.close()


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def live_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One real ``corral server`` process per database, shared by the tests that only read
    what they create (authorization matrix, messages, schemathesis)."""
    home = tmp_path_factory.mktemp(f"live-{request.param}")
    schema = None
    if request.param == "sqlite":
        db = str(home / "corral.db")
    else:
        require_postgres()
        schema = f"t_live_{uuid.uuid4().hex[:10]}"
        db = f"{PG_BASE}?schema={schema}"
    proc = ServerProcess(db, home).start()
    try:
        yield proc
    finally:
        proc.stop()
        if schema:
            drop_schema(schema)
