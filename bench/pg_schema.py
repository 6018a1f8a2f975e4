"""Start a benchmark's PostgreSQL schema empty: drop it (the server recreates it)."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlsplit, urlunsplit

LOCAL = "postgresql://postgres@127.0.0.1:5432/test"


def drop_schema(schema: str, dsn: str = LOCAL) -> None:
    """``DROP SCHEMA IF EXISTS schema CASCADE`` on the database at ``dsn``."""
    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def drop_schema_of(url: str) -> None:
    """Drop the schema named by ``?schema=`` in a corral ``--db`` URL (none named: nothing)."""
    parts = urlsplit(url)
    schema = parse_qs(parts.query).get("schema", [""])[0]
    if schema:
        drop_schema(schema, urlunsplit(parts._replace(query="")))
