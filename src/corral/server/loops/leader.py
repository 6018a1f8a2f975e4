"""Who runs the scheduling loop: one process at a time (DESIGN.md section 6).

With SQLite there is one server process: it always leads. With PostgreSQL,
several replicas may share the database; the leader is whoever holds a
session-level advisory lock on a dedicated connection. If that connection
breaks, the lock is gone with it and another replica takes over within one
idle cycle. No home-made consensus: PostgreSQL decides.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("corral.server.leader")

LEADER_LOCK = 0x636F72726C6C64  # "corrlld": distinct from the event-ordering lock


class Leadership(Protocol):
    async def acquire(self) -> bool:
        """True when this process may run the scheduling cycle now."""
        ...

    async def release(self) -> None: ...


class AlwaysLeader:
    """The single-process case (SQLite)."""

    async def acquire(self) -> bool:
        return True

    async def release(self) -> None:
        return None


class AdvisoryLockLeader:
    """Leadership by ``pg_try_advisory_lock`` held on a connection kept for that purpose."""

    def __init__(self, engine: AsyncEngine, key: int = LEADER_LOCK) -> None:
        self.engine = engine
        self.key = key
        self._conn: AsyncConnection | None = None

    async def acquire(self) -> bool:
        if self._conn is not None:
            try:
                await _ping(self._conn)
                return True
            except Exception:  # the connection (and with it the lock) is gone
                log.warning("lost the scheduling leadership (connection broke)")
                await self._drop(broken=True)
        conn = await self.engine.connect()
        try:
            got = (await conn.execute(sa.select(sa.func.pg_try_advisory_lock(self.key)))).scalar()
            await conn.commit()  # never sit "idle in transaction" while leading
        except Exception:
            await conn.close()
            raise
        if got:
            self._conn = conn
            log.info("this replica now runs the scheduling loop")
            return True
        await conn.close()
        return False

    async def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.execute(sa.select(sa.func.pg_advisory_unlock(self.key)))
            await self._drop()

    async def _drop(self, *, broken: bool = False) -> None:
        """Let go of the leader's connection; a ``broken`` one never goes back to the pool
        (the ping runs on asyncpg itself, so SQLAlchemy did not see it fail)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                if broken:
                    await conn.invalidate()
                await conn.close()


async def _ping(conn: AsyncConnection) -> None:
    """Raise unless ``conn`` (and so the session lock it holds) is still there.

    Every cycle asks, so it is one round trip on the asyncpg connection itself
    (no transaction around it), not SQLAlchemy's begin, select and commit:
    those were 2 ms of an idle round trip's critical path on the benchmark
    machine (docs/performance.md, "PostgreSQL").
    """
    raw: Any = (await conn.get_raw_connection()).driver_connection
    if hasattr(raw, "fetchval"):  # asyncpg
        await raw.fetchval("SELECT 1")
        return
    await conn.execute(sa.text("SELECT 1"))
    await conn.commit()
