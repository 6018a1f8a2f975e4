"""SQLite for the async engine without a thread hop per statement.

``aiosqlite`` runs every call (cursor, execute, fetch, close) on its own
thread and hands the answer back through the event loop: four thread
switches and loop wake-ups per statement. A unit of work here runs a dozen
statements, each taking microseconds inside SQLite, so those hops were most
of the server's time under load.

This module offers the same small async surface SQLAlchemy's ``aiosqlite``
dialect uses (``create_async_engine(..., async_creator=connector(path))``),
but runs statements inline on the event loop: reads and writes on a local
WAL database return in microseconds, and WAL readers never wait for the
writer. The one call that can take long, ``COMMIT`` (it fsyncs the WAL under
``synchronous=FULL``, and may checkpoint), runs on a worker thread so the
loop keeps serving while the disk works; a commit that does not wait for
the disk (``synchronous=NORMAL``) runs inline as well. Writers are already serialised by
``Database.write``; nothing uses a connection from two threads at once.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

COMMITS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-sqlite-commit")
"""One thread for every commit: there is one writer at a time anyway."""


def connector(path: str, *, timeout: float = 30.0) -> Callable[[], Awaitable[InlineConnection]]:
    """The ``async_creator`` for ``create_async_engine``: a new connection to ``path``."""

    async def connect() -> InlineConnection:
        raw = sqlite3.connect(path, timeout=timeout, check_same_thread=False)
        return InlineConnection(raw)

    return connect


class InlineConnection:
    """What SQLAlchemy's aiosqlite adapter calls on a driver connection."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self._connection: sqlite3.Connection | None = raw
        self._tx = _Inline()  # the adapter's isolation_level setter queues work here
        # False while the connection commits with synchronous=NORMAL or OFF: such a commit
        # only writes to the WAL (no fsync), so it runs inline too (no thread hop).
        self.commit_waits_for_disk = True

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._connection is None:
            raise ValueError("no active connection")
        return self._connection

    @property
    def isolation_level(self) -> str | None:
        return self._conn.isolation_level

    def cursor(self) -> _Opening:
        return _Opening(InlineCursor(self._conn.cursor()))

    async def commit(self) -> None:
        raw = self._conn
        if not raw.in_transaction:
            return
        if self.commit_waits_for_disk:
            await asyncio.get_running_loop().run_in_executor(COMMITS, raw.commit)
        else:
            raw.commit()

    async def rollback(self) -> None:
        self._conn.rollback()

    async def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def create_function(self, *args: Any, **kwargs: Any) -> None:
        self._conn.create_function(*args, **kwargs)


class InlineCursor:
    """An ``aiosqlite.Cursor`` look-alike whose calls run at once."""

    def __init__(self, raw: sqlite3.Cursor) -> None:
        self._raw = raw

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> InlineCursor:
        self._raw.execute(sql, parameters)
        return self

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> InlineCursor:
        self._raw.executemany(sql, rows)
        return self

    async def fetchone(self) -> Any:
        return self._raw.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._raw.fetchmany(size if size is not None else self._raw.arraysize)

    async def fetchall(self) -> list[Any]:
        return self._raw.fetchall()

    async def close(self) -> None:
        self._raw.close()

    async def nextset(self) -> None:
        return None

    async def setinputsizes(self, *sizes: Any) -> None:
        return None

    def __aiter__(self) -> InlineCursor:
        return self

    async def __anext__(self) -> Any:
        row = self._raw.fetchone()
        if row is None:
            raise StopAsyncIteration
        return row

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._raw.close()

    @property
    def description(self) -> Any:
        return self._raw.description

    @property
    def rowcount(self) -> int:
        return self._raw.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._raw.lastrowid

    @property
    def arraysize(self) -> int:
        return self._raw.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._raw.arraysize = value


class _Opening:
    """``connection.cursor()`` is awaited or entered (``async with``): both give the cursor."""

    def __init__(self, cursor: InlineCursor) -> None:
        self._cursor = cursor

    def __await__(self) -> Generator[Any, None, InlineCursor]:
        return self._cursor.__aenter__().__await__()

    async def __aenter__(self) -> InlineCursor:
        return self._cursor

    async def __aexit__(self, *exc: object) -> None:
        await self._cursor.close()


class _Inline:
    """Stands in for aiosqlite's work queue: run the function now, answer its future."""

    def put_nowait(self, item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except BaseException as exc:  # handed to whoever awaits the future
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        if future is not None and not future.done():
            future.set_result(result)
