"""Policy versions: one row per document applied; the highest version is in force."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.sql import Query
from corral.server.store.tables import policies

# Run on the driver connection (``sql.Query``): the scheduling loop reads it every cycle.
_LATEST = Query(sa.select(sa.func.max(policies.c.version).label("version")))


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    version: int
    document: str
    applied_by: str
    applied_at: float
    note: str = ""


async def latest_version(conn: AsyncConnection) -> int:
    """The version in force (0: none applied yet, the built-in policy)."""
    rows = await _LATEST.tuples(conn)
    return int(rows[0][0] or 0)


async def get(conn: AsyncConnection, version: int) -> PolicyVersion | None:
    row = (await conn.execute(sa.select(policies).where(policies.c.version == version))).first()
    return None if row is None else _version(row)


async def history(conn: AsyncConnection, limit: int) -> list[PolicyVersion]:
    """The latest ``limit`` versions, newest first."""
    query = sa.select(policies).order_by(policies.c.version.desc()).limit(limit)
    return [_version(row) for row in await conn.execute(query)]


async def insert(conn: AsyncConnection, entry: PolicyVersion) -> None:
    """Add a version; a concurrent apply of the same number fails on the primary key."""
    await conn.execute(
        policies.insert().values(
            version=entry.version,
            document=entry.document,
            applied_by=entry.applied_by,
            applied_at=entry.applied_at,
            note=entry.note,
        )
    )


def _version(row: sa.Row[tuple[object, ...]]) -> PolicyVersion:
    m = row._mapping
    return PolicyVersion(
        int(m["version"]),
        str(m["document"]),
        str(m["applied_by"]),
        float(m["applied_at"]),
        str(m["note"]),
    )
