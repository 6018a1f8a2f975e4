"""Connecting to the store: URL mapping, SQLite pragmas, the write gate, migrations.

Two databases are supported with the same tables and code:

* SQLite (one file, WAL): one process; writes are serialised by an asyncio
  lock in this process (SQLite allows one writer anyway; the lock avoids
  ``database is locked`` retries). A lock file next to the database keeps a
  second server process off it (``sqlite_lock``).
* PostgreSQL (asyncpg): several replicas may share it. Every write
  transaction that appends events first takes a transaction-scoped advisory
  lock, so events become visible in ``seq`` order and an SSE reader resuming
  after ``seq`` N can never miss an event with a smaller ``seq`` that commits
  later. Transactions are short, so this costs little; group commits
  (several requests per transaction) are the way to more throughput.
  A connection's first such transaction also checks that no crash of
  PostgreSQL forgot event numbers since (``events.pg_mark_epoch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from corral.core.errors import InvalidSpec
from corral.server.store import sqlite_inline
from corral.server.store.events import pg_mark_epoch
from corral.server.store.sql import RAW
from corral.server.store.sqlite_lock import SqliteLock
from corral.server.store.sqlite_writer import KeptWriter
from corral.server.store.wal_sync import WalSync

log = logging.getLogger("corral.server.store")

EVENT_ORDER_LOCK = 0x636F7272616C  # "corral": the advisory lock that orders event commits
EPOCH_SEEN = "corral_epoch_seen"  # conn.info: this connection checked the event marker
# SQLite checkpoints (copies the WAL back into the database file and fsyncs it) inside the
# commit that takes the WAL past this many pages: on the loop, 2-10 ms each. A commit here
# rewrites the same right-hand pages (store/ids.py), so a checkpoint every 4,000 pages copies
# few more pages than one every 1,000 (SQLite's default) did: a quarter of the stalls, for a
# WAL of up to 16 MB (docs/performance.md, "End to end").
WAL_AUTOCHECKPOINT_PAGES = 4000
WAL_HEADER_BYTES = 32  # SQLite's WAL: a header, then frames of a page and its header
WAL_FRAME_HEADER_BYTES = 24


def lock_key(base: int, schema: str | None) -> int:
    """An advisory-lock key per schema, so servers on different schemas never contend."""
    if not schema:
        return base
    digest = int.from_bytes(hashlib.sha256(schema.encode()).digest()[:6], "big")
    return (base ^ digest) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass(frozen=True, slots=True)
class DbTarget:
    """A parsed ``--db``: the SQLAlchemy URL, the dialect and an optional PG schema."""

    url: URL
    dialect: str  # "sqlite" or "postgresql"
    schema: str | None = None

    def display(self) -> str:
        """The URL without a password, for banners and logs."""
        shown = self.url.render_as_string(hide_password=True)
        return f"{shown} (schema {self.schema})" if self.schema else shown


def parse_db(text: str) -> DbTarget:
    """Map a ``--db`` to a driver URL: paths and sqlite:// to aiosqlite, postgresql to asyncpg."""
    if "://" not in text:
        path = Path(text).expanduser().resolve()
        return DbTarget(make_url(f"sqlite+aiosqlite:///{path}"), "sqlite")
    scheme = text.split("://", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        url = make_url(text).set(drivername="sqlite+aiosqlite")
        if url.database and url.database != ":memory:":
            url = url.set(database=str(Path(url.database).expanduser()))
        return DbTarget(url, "sqlite")
    if scheme in ("postgresql", "postgres"):
        rest, schema = _pop_schema(text.split("://", 1)[1])
        url = make_url(f"postgresql+asyncpg://{rest}")
        return DbTarget(url, "postgresql", schema)
    raise InvalidSpec("db", f"unsupported database {scheme!r}: use a SQLite path or postgresql://")


def _pop_schema(rest: str) -> tuple[str, str | None]:
    """Take ``schema=`` out of the query string (asyncpg does not know it)."""
    parts = urlsplit("x://" + rest)
    query = parse_qsl(parts.query)
    schema = next((v for k, v in query if k == "schema"), None)
    if schema is not None and not schema.replace("_", "").isalnum():
        raise InvalidSpec("db", f"schema must be letters, digits and _, got {schema!r}")
    kept = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=kept))[len("x://") :], schema


class Database:
    """The engine plus the rules for reading and writing through it."""

    def __init__(
        self,
        target: DbTarget,
        *,
        sqlite_synchronous: str = "FULL",
        pool_size: int = 10,
        pool_timeout_s: float = 30.0,
        wal_prefill: bool = True,
    ):
        self.target = target
        self.wal_prefill = wal_prefill  # zero-fill the WAL at ``prepare`` (WalSync.prefill)
        # A SQLite file that must survive power loss: commits skip SQLite's own fsync and a
        # durable write waits for WalSync's, taken after the write lock is released.
        self.wal_sync = _wal_sync(target, sqlite_synchronous)
        self.engine = _make_engine(target, sqlite_synchronous, (pool_size, pool_timeout_s))
        sqlite = target.dialect == "sqlite"
        self._write_lock = asyncio.Lock() if sqlite else None
        deferred = self.wal_sync is not None  # durable commits fsync later, through WalSync
        self._writer = KeptWriter(self.engine, sqlite_synchronous, deferred) if sqlite else None
        self.event_lock = lock_key(EVENT_ORDER_LOCK, target.schema)
        self._pg_begin = {
            (ordered, durable): "BEGIN"
            + ("" if durable else "; SET LOCAL synchronous_commit TO off")
            + (f"; SELECT pg_advisory_xact_lock({self.event_lock})" if ordered else "")
            for ordered in (False, True)
            for durable in (False, True)
        }
        self.file_lock = _file_lock(target)
        # A SQLite server's first event after a start is numbered past anything a crash may
        # have forgotten (``events.SEQ_JUMP``); 0 once such an event is committed.
        self.event_jump = 0

    def claim(self) -> None:
        """Make sure no other server uses this SQLite file (``StoreInUse`` otherwise)."""
        if self.file_lock is not None:
            self.file_lock.acquire()

    @property
    def is_postgres(self) -> bool:
        return self.target.dialect == "postgresql"

    @contextlib.asynccontextmanager
    async def write(
        self,
        *,
        ordered_events: bool = True,
        durable: bool = True,
        on_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[AsyncConnection]:
        """One write transaction; commits on exit, rolls back on error.

        ``ordered_events=False`` is for writes that append no events (heartbeats),
        which then do not queue behind the event-ordering lock on PostgreSQL.
        ``durable=False`` is for writes no promise rests on until a later durable
        one (placements, starts, progress): on SQLite they commit without an
        fsync (see ``sqlite_writer``); on PostgreSQL with ``synchronous_commit``
        off (see ``_pg_transaction``).

        On a SQLite file with ``synchronous`` FULL, every commit is written to the
        WAL without an fsync, the write lock is released, and then a durable write
        waits for an fsync of the WAL (``WalSync``) before returning: what FULL
        does, but other writers go on meanwhile and one fsync covers every commit
        before it. ``on_commit`` is awaited right after the commit (and after that
        fsync was handed to the thread, when fsyncs go there), before the wait.
        """
        if self._writer is not None and self._write_lock is not None:
            # SQLite: the kept connection (sqlite_writer), one writer at a time
            async with self._write_lock, self._writer.transaction(durable=durable) as conn:
                yield conn
        else:  # PostgreSQL: the transaction runs on the asyncpg connection
            async with (
                self.engine.connect() as conn,
                self._pg_transaction(conn, ordered_events, durable) as raw,
            ):
                yield raw
        position = self.wal_sync.mark() if self.wal_sync is not None else 0
        if durable and self.wal_sync is not None:
            # An fsync on the thread starts before on_commit pokes anyone: a scheduling
            # cycle woken by the poke would otherwise run first and hold it back.
            self.wal_sync.start(position)
        if on_commit is not None:
            await on_commit()
        if durable and self.wal_sync is not None:
            await self._synced(self.wal_sync, position)

    async def _synced(self, wal_sync: WalSync, position: int) -> None:
        """Wait for the fsync that covers the commit at ``position``. Its failure is logged,
        not raised: the change has committed, and a caller told it failed would make it
        again (a second job). It is in the WAL (it survives a kill of the process), and
        the next durable commit's fsync covers it."""
        try:
            await wal_sync.wait(position)
        except OSError:
            log.exception("a commit is in the WAL but its fsync failed; the next one retries")

    async def sync_committed(self) -> None:
        """Return once every commit made so far is on disk (SQLite with ``WalSync``)."""
        if self.wal_sync is not None:
            await self.wal_sync.wait(self.wal_sync.committed)

    @contextlib.asynccontextmanager
    async def _pg_transaction(
        self, conn: AsyncConnection, ordered_events: bool, durable: bool
    ) -> AsyncIterator[AsyncConnection]:
        """Run ``conn``'s transaction on its asyncpg connection, in as few round trips as can be.

        One simple query opens it: ``BEGIN``, for a write no promise rests on
        (``durable=False``) ``SET LOCAL synchronous_commit TO off`` (its commit
        does not wait for PostgreSQL's WAL flush; a crash of PostgreSQL may lose
        it, as SQLite's relaxed commits may, and reconciliation recovers those),
        and the event-ordering lock. ``COMMIT`` closes it. Meanwhile the
        SQLAlchemy adapter is in autocommit (``sql.RAW``), so statements sent
        through SQLAlchemy run inside this transaction and its own commit and
        rollback do nothing, and ``sql.Query`` runs on the asyncpg connection.
        A connection whose rollback failed, or that a cancel left mid-statement,
        is invalidated (closed; PostgreSQL rolls back).
        """
        adapted = _adapter(conn)
        raw = adapted._connection
        adapted.isolation_level = RAW
        # A connection's first ordered write checks that no crash of PostgreSQL emptied
        # the event marker since (every connection after such a crash is new).
        unmarked = ordered_events and not conn.info.get(EPOCH_SEEN)
        try:
            try:
                await raw.execute(self._pg_begin[ordered_events, durable])
                if unmarked:
                    await pg_mark_epoch(raw)
                yield conn
                await raw.execute("COMMIT")
                if unmarked:
                    conn.info[EPOCH_SEEN] = True
            except BaseException as exc:  # from BEGIN (a cancelled lock wait), the body, COMMIT
                await _pg_abandon(conn, raw, exc)
                raise
        finally:
            adapted.isolation_level = adapted._isolation_setting

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reads (nothing is written through it).

        On PostgreSQL each statement runs on its own (autocommit: no ``BEGIN``
        and ``ROLLBACK`` round trips); under READ COMMITTED a statement sees
        its own snapshot either way.
        """
        async with self.engine.connect() as conn:
            if not self.is_postgres:
                yield conn
                return
            adapted = _adapter(conn)
            adapted.isolation_level = RAW
            try:
                yield conn
            except BaseException:
                # asyncpg cancels a statement whose task was cancelled and the connection
                # stays usable; one left inside a transaction (a stray BEGIN) is not.
                if adapted._connection.is_in_transaction():
                    await conn.invalidate()
                raise
            finally:
                adapted.isolation_level = adapted._isolation_setting

    async def prepare(self) -> None:
        """Create the directory or schema, then bring the tables to the latest migration."""
        from corral.server.store.migrate import upgrade

        if self.target.dialect == "sqlite" and self.target.url.database not in (None, ":memory:"):
            Path(str(self.target.url.database)).parent.mkdir(parents=True, exist_ok=True)
        self.claim()
        if self.target.schema:
            async with self.engine.begin() as conn:
                await conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{self.target.schema}"'))
        async with self.engine.begin() as conn:
            await conn.run_sync(upgrade)
        if self._writer is not None:  # SQLite: this process is its one writer
            from corral.server.store.events import SEQ_JUMP

            self.event_jump = SEQ_JUMP
            if self.wal_sync is not None and self.wal_prefill:
                await self._prefill_wal()

    async def _prefill_wal(self) -> None:
        """Zero-fill the WAL to the size it reaches between checkpoints (``WalSync.prefill``),
        holding SQLite's write lock so no commit appends to it meanwhile."""
        assert self._writer is not None
        assert self._write_lock is not None
        assert self.wal_sync is not None
        async with self._write_lock, self._writer.exclusive() as raw:
            page = int(raw.execute("PRAGMA page_size").fetchone()[0])
            size = WAL_HEADER_BYTES + WAL_AUTOCHECKPOINT_PAGES * (WAL_FRAME_HEADER_BYTES + page)
            await asyncio.to_thread(self.wal_sync.prefill, size)

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()
        if self.wal_sync is not None:
            self.wal_sync.file.close()
        await self.engine.dispose()
        if self.file_lock is not None:
            self.file_lock.release()


def _adapter(conn: AsyncConnection) -> Any:
    """SQLAlchemy's asyncpg adapter under a checked-out ``conn``."""
    return conn.sync_connection._dbapi_connection.dbapi_connection  # type: ignore[union-attr]


async def _pg_abandon(conn: AsyncConnection, raw: Any, exc: BaseException) -> None:
    """Roll back after ``exc``; a connection that cannot be trusted is closed instead.

    After an error the transaction is rolled back and the connection serves on.
    After a cancel (the statement in flight may still run: asyncpg only asks the
    server to cancel it), or when the rollback fails, the connection is
    invalidated: closed, so PostgreSQL rolls back whatever it held.
    """
    clean = False
    try:
        if isinstance(exc, Exception) and not raw.is_closed():
            await raw.execute("ROLLBACK")  # only a warning when COMMIT already ended it
            clean = True
    except Exception:
        pass
    finally:
        if not clean:
            await conn.invalidate()


def _file_lock(target: DbTarget) -> SqliteLock | None:
    database = target.url.database
    if target.dialect != "sqlite" or database in (None, "", ":memory:"):
        return None
    return SqliteLock(Path(str(database)))


def _wal_sync(target: DbTarget, synchronous: str) -> WalSync | None:
    database = target.url.database
    if target.dialect != "sqlite" or database in (None, "", ":memory:"):
        return None
    if synchronous not in ("FULL", "EXTRA"):
        return None  # the operator chose to survive kill -9 only (NORMAL) or nothing (OFF)
    return WalSync(Path(f"{database}-wal"))


def _make_engine(target: DbTarget, synchronous: str, pool: tuple[int, float]) -> AsyncEngine:
    """The engine; ``pool``: PostgreSQL's pool size and how long a checkout may wait."""
    if target.dialect == "postgresql":
        connect_args: dict[str, Any] = {}
        if target.schema:
            connect_args["server_settings"] = {"search_path": target.schema}
        size, timeout = pool
        engine = create_async_engine(
            target.url,
            pool_size=size,
            max_overflow=size,
            pool_timeout=timeout,
            connect_args=connect_args,
        )
        return engine
    # Statements run inline on the loop, commits on a thread (see sqlite_inline).
    path = target.url.database or ":memory:"
    engine = create_async_engine(target.url, async_creator=sqlite_inline.connector(path))
    sa.event.listen(engine.sync_engine, "connect", _sqlite_pragmas(synchronous))
    sa.event.listen(engine.sync_engine, "begin", _sqlite_begin)
    return engine


def _sqlite_begin(conn: Any) -> None:
    """Emit BEGIN ourselves (the driver's own transaction handling breaks SAVEPOINT), unless
    the kept writer began one (``sqlite_writer``): SQLAlchemy's then runs inside it."""
    driver = conn.connection.driver_connection
    if isinstance(driver, sqlite_inline.InlineConnection) and driver._conn.in_transaction:
        return
    conn.exec_driver_sql("BEGIN")


def _sqlite_pragmas(synchronous: str) -> Any:
    """WAL (readers never block the writer), a busy timeout, foreign keys on."""

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # autocommit at the driver; _sqlite_begin opens txs
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
        cursor.close()

    return on_connect
