"""Queries on the ``tokens`` table. Only hashes are stored, never a secret."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.tables import tokens


async def insert(conn: AsyncConnection, **values: Any) -> None:
    await conn.execute(sa.insert(tokens).values(**values))


async def by_hash(conn: AsyncConnection, digest: str) -> Any | None:
    return (await conn.execute(sa.select(tokens).where(tokens.c.hash == digest))).first()


async def listing(conn: AsyncConnection) -> list[Any]:
    return list(await conn.execute(sa.select(tokens).order_by(tokens.c.created_at, tokens.c.id)))


async def has_admin(conn: AsyncConnection) -> bool:
    query = sa.select(tokens.c.id).where(tokens.c.kind == "admin", tokens.c.revoked_at.is_(None))
    return (await conn.execute(query.limit(1))).first() is not None


async def revoke(conn: AsyncConnection, token_id: str, at: float) -> bool:
    result = await conn.execute(
        sa.update(tokens)
        .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
        .values(revoked_at=at)
    )
    return bool(result.rowcount == 1)


async def revoked_among(conn: AsyncConnection, ids: Collection[str]) -> list[str]:
    """Those of ``ids`` that are revoked (or no longer exist)."""
    wanted = sorted(ids)
    query = sa.select(tokens.c.id).where(tokens.c.id.in_(wanted), tokens.c.revoked_at.is_(None))
    live = {row.id for row in await conn.execute(query)}
    return [i for i in wanted if i not in live]


async def revoke_admins(conn: AsyncConnection, keep: str, at: float) -> list[str]:
    """Revoke every live admin token but ``keep``; their ids."""
    query = sa.select(tokens.c.id).where(
        tokens.c.kind == "admin", tokens.c.revoked_at.is_(None), tokens.c.id != keep
    )
    ids = [row.id for row in await conn.execute(query)]
    if ids:
        await conn.execute(
            sa.update(tokens)
            .where(tokens.c.id.in_(ids), tokens.c.revoked_at.is_(None))
            .values(revoked_at=at)
        )
    return ids
