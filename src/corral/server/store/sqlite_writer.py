"""The one SQLite writer connection, kept checked out, its transactions begun and ended raw.

An empty write transaction through SQLAlchemy's connection handling (pool
check-out, execution options, ``begin`` event, ``COMMIT`` through the
adapter, check-in with its reset) cost about 0.5 ms of CPU here, several
times the statements a unit runs inside it (``sql.Query``). SQLite has one
writer at a time anyway (``Database.write`` holds an asyncio lock), so the
writer keeps one connection and runs ``BEGIN`` / ``COMMIT`` / ``ROLLBACK``
on its ``sqlite3`` connection. SQLAlchemy still sees an ordinary
connection: a statement it runs autobegins its own transaction on top
(``db._sqlite_begin`` then emits no second ``BEGIN``), which is committed
or rolled back through SQLAlchemy with the raw one.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from corral.server.store.sqlite_inline import InlineConnection


class KeptWriter:
    def __init__(self, engine: AsyncEngine, synchronous: str, deferred: bool) -> None:
        self._engine = engine
        self._synchronous = synchronous
        self._relaxed = "OFF" if synchronous == "OFF" else "NORMAL"
        self._deferred = deferred  # durable writes fsync later (WalSync): commit relaxed
        self._conn: AsyncConnection | None = None
        self._level: str | None = None  # PRAGMA synchronous as last set on the connection

    @contextlib.asynccontextmanager
    async def transaction(self, *, durable: bool) -> AsyncIterator[AsyncConnection]:
        """One transaction on the kept connection; the caller holds the write lock."""
        conn, inline = await self._connection()
        raw = inline._conn
        level = self._synchronous if durable and not self._deferred else self._relaxed
        if level != self._level:  # only outside a transaction
            raw.execute(f"PRAGMA synchronous={level}")
            self._level = level
            inline.commit_waits_for_disk = level in ("FULL", "EXTRA")
        raw.execute("BEGIN")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction():
                await conn.rollback()
            if raw.in_transaction:
                raw.rollback()
            raise
        if conn.in_transaction():
            await conn.commit()  # ends SQLAlchemy's transaction; the driver commits the raw one
        await inline.commit()  # no-op when nothing is open any more

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[sqlite3.Connection]:
        """SQLite's write lock held, no transaction of ours open on the kept connection: its
        raw connection, for work on the files that no commit may interleave with (the
        caller holds the write lock); nothing is written through it, it rolls back."""
        _, inline = await self._connection()
        raw = inline._conn
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield raw
        finally:
            raw.rollback()

    async def _connection(self) -> tuple[AsyncConnection, InlineConnection]:
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            conn = self._conn = await self._engine.connect()
        inline = inline_of(conn)
        if inline is None:
            raise RuntimeError("the kept SQLite writer needs the inline driver")
        return conn, inline

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
            self._level = None


def inline_of(conn: AsyncConnection) -> InlineConnection | None:
    """The inline driver connection under ``conn``, if any."""
    sync = conn.sync_connection
    fairy = None if sync is None or sync.closed else sync._dbapi_connection
    driver = None if fairy is None else fairy.driver_connection
    return driver if isinstance(driver, InlineConnection) else None
