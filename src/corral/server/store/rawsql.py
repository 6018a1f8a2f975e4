"""Hot statements straight to ``sqlite3`` when SQLite runs inline (``sqlite_inline``).

SQLAlchemy Core costs 30-50 us of Python around each statement (execution
context, parameter processing, result proxy, a greenlet switch) where the
statement itself takes 2-5 us inside SQLite; a job's life runs about twenty
of them. For the statements the job path runs all the time (rows by key,
guarded updates, inserts, event appends) the repos ask ``driver(conn)`` for
the ``sqlite3`` connection under an inline SQLite connection and run plain
SQL on it, inside the same transaction (the connection is the same one; its
``BEGIN`` was emitted by ``db._sqlite_begin``). Everywhere else, and on
PostgreSQL, they go through SQLAlchemy as before.

``Codec`` encodes values the way SQLAlchemy's types do on SQLite (JSON as
JSON text (``jsontext.dumps``), ``None`` in a JSON column as ``'null'``; booleans as
0/1; scalar column defaults on insert) and decodes rows into named tuples
with the same attribute names, so ``records`` converts both alike.
"""

from __future__ import annotations

import json
import sqlite3
from collections import namedtuple
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.jsontext import dumps
from corral.server.store.sqlite_inline import InlineConnection

CHUNK = 900  # keys per IN (...): below SQLite's default bound-parameter limit


def driver(conn: AsyncConnection) -> sqlite3.Connection | None:
    """The ``sqlite3`` connection under ``conn`` when SQLite runs inline, else None."""
    sync = conn.sync_connection
    if sync is None:
        return None
    fairy = sync._dbapi_connection  # set while the connection is checked out (None: closed)
    if fairy is None:
        return None
    # The aiosqlite adapter's driver connection, read as ``pgraw.pg`` reads asyncpg's: the
    # public ``fairy.driver_connection`` went through three properties and the dialect, and
    # this runs about eight times per job.
    inline = getattr(fairy.dbapi_connection, "_connection", None)
    if not isinstance(inline, InlineConnection):
        return None
    return inline._connection


class Codec:
    """One table's columns, how to bind their values and how to read its rows."""

    def __init__(self, table: sa.Table) -> None:
        cols = list(table.columns)
        self.name = table.name
        self.names = tuple(c.name for c in cols)
        self.select = f"SELECT {', '.join(_q(n) for n in self.names)} FROM {_q(table.name)}"
        self._json = frozenset(c.name for c in cols if isinstance(c.type, sa.JSON))
        self._json_at = tuple(i for i, n in enumerate(self.names) if n in self._json)
        self._bool_at = tuple(i for i, c in enumerate(cols) if isinstance(c.type, sa.Boolean))
        self._defaults = {
            c.name: c.default.arg  # type: ignore[attr-defined]
            for c in cols
            if c.default is not None and c.default.is_scalar
        }
        self.row = namedtuple(f"{table.name}_row", self.names)  # type: ignore[misc]
        self._updates: dict[tuple[str, tuple[str, ...]], str] = {}
        self._inserts: dict[tuple[str, ...], str] = {}

    def decode(self, raw: Sequence[Any]) -> Any:
        """A row as a named tuple with SQLAlchemy's Python values."""
        values = list(raw)
        for i in self._json_at:
            if values[i] is not None:
                values[i] = json.loads(values[i])
        for i in self._bool_at:
            if values[i] is not None:
                values[i] = bool(values[i])
        return self.row._make(values)  # type: ignore[attr-defined]

    def by_keys(self, db: sqlite3.Connection, column: str, keys: Sequence[Any]) -> list[Any]:
        """Rows whose ``column`` is one of ``keys`` (any order)."""
        out: list[Any] = []
        for i in range(0, len(keys), CHUNK):
            part = keys[i : i + CHUNK]
            marks = ", ".join("?" * len(part))
            sql = f"{self.select} WHERE {_q(column)} IN ({marks})"
            out.extend(self.decode(r) for r in db.execute(sql, tuple(part)))
        return out

    def where(self, db: sqlite3.Connection, clause: str, params: Sequence[Any] = ()) -> list[Any]:
        return [self.decode(r) for r in db.execute(f"{self.select} {clause}", tuple(params))]

    def insert(self, db: sqlite3.Connection, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert rows (each a dict of column values; missing columns get their defaults)."""
        batch = [self._defaults | dict(r) for r in rows]
        if not batch:
            return
        names = tuple(batch[0])
        sql = self._inserts.get(names)
        if sql is None:
            cols = ", ".join(_q(n) for n in names)
            sql = f"INSERT INTO {_q(self.name)} ({cols}) VALUES ({', '.join('?' * len(names))})"
            self._inserts[names] = sql
        json = self._json
        db.executemany(
            sql, [[dumps(r[n]) if n in json else r[n] for n in names] for r in batch]
        )  # JSON columns as text, inline: a call per column was a third of an insert's time

    def guarded_update(
        self,
        db: sqlite3.Connection,
        key: tuple[str, Any],
        version: int,
        values: Mapping[str, Any],
    ) -> bool:
        """``UPDATE ... SET values, version+1 WHERE key AND version``; True when it matched."""
        column, value = key
        names = tuple(values)
        sql = self._updates.get((column, names))
        if sql is None:
            sets = ", ".join(f"{_q(n)} = ?" for n in names)
            sql = (
                f"UPDATE {_q(self.name)} SET {sets}{', ' if sets else ''}version = version + 1 "
                f"WHERE {_q(column)} = ? AND version = ?"
            )
            self._updates[(column, names)] = sql
        json = self._json
        params = [dumps(values[n]) if n in json else values[n] for n in names]
        params += (value, version)
        return db.execute(sql, params).rowcount == 1


_CODECS: dict[str, Codec] = {}


def codec(table: sa.Table) -> Codec:
    found = _CODECS.get(table.name)
    if found is None:
        found = _CODECS[table.name] = Codec(table)
    return found


def _q(name: str) -> str:
    return f'"{name}"'
