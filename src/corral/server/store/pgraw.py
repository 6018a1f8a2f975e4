"""Hot statements straight to asyncpg on PostgreSQL (what ``rawsql`` is for SQLite).

Through SQLAlchemy Core each statement costs 100-200 us of Python in this
server (compiling the cache key, the execution context, parameter and result
processing, a greenlet switch) around a round trip that PostgreSQL answers in
tens of microseconds; a job runs about twenty of them. ``Database.write`` and
``Database.read`` hand out connections whose transaction they run themselves
on the asyncpg connection (``RAW``, see ``db.py``); for those, ``pg(conn)``
returns that asyncpg connection and the repos run plain SQL on it, inside the
same transaction, as prepared statements (asyncpg keeps them per connection).
Every other connection (tests, migrations, anything that began a transaction
through SQLAlchemy) gets None and goes through SQLAlchemy as before.

``PgCodec`` binds values as SQLAlchemy's types do on this driver: JSON as
``json.dumps`` text (``None`` in a JSON column as ``'null'``, which reads back
as ``None``), scalar column defaults on insert. Rows come back as named tuples
with the column names, so ``records`` converts them like SQLAlchemy rows (the
dialect's JSON codec on the connection already decodes JSON).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.jsontext import dumps

RAW = "autocommit"
"""The adapter's isolation level while ``Database`` runs the transaction itself (see db.py)."""

_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def adapter(conn: AsyncConnection) -> Any:
    """SQLAlchemy's asyncpg adapter under ``conn`` (None when not checked out or not asyncpg)."""
    sync = conn.sync_connection
    if sync is None:
        return None
    fairy = sync._dbapi_connection  # set while the connection is checked out
    if fairy is None:
        return None
    adapted: Any = fairy.dbapi_connection
    return adapted if hasattr(adapted, "_prepared_statement_cache") else None


def pg(conn: AsyncConnection) -> Any:
    """The asyncpg connection under ``conn`` when ``Database`` runs its transaction, else None."""
    sync = conn.sync_connection
    if sync is None:
        return None
    fairy = sync._dbapi_connection
    if fairy is None:
        return None
    adapted: Any = fairy.dbapi_connection
    if getattr(adapted, "isolation_level", None) != RAW:
        return None
    return adapted._connection


SEEN_JOBS = "corral_pg_seen_jobs"
"""``conn.info`` key: job rows read with their allocation (``allocations.get``), by id."""


def seen_jobs(conn: AsyncConnection) -> dict[str, Any]:
    """The job rows ``allocations.get`` read along with an allocation in this transaction.

    ``jobs.get``/``get_many`` take them (once) instead of asking again: they
    were read in the same transaction a moment before, as a read statement
    there would have. Any write to ``jobs`` (``forget_read_ahead``), a rollback to a
    savepoint (``db``) and the start of every transaction or read forget them.
    """
    return _read_ahead(conn, SEEN_JOBS)


SEEN_STREAKS = "corral_pg_seen_streaks"
"""``conn.info`` key: nodes' ``failure_streak`` read with an allocation (``allocations.get``)."""


def seen_streaks(conn: AsyncConnection) -> dict[str, int]:
    """The failure streak of each node whose allocation ``allocations.get`` read in this
    transaction: ``nodes.reset_streak`` skips its statement when it was 0 already (a
    success on a healthy node, nearly every end, costs no round trip for it). Forgotten
    with the job rows read ahead, and by any write to ``nodes``."""
    return _read_ahead(conn, SEEN_STREAKS)


def _read_ahead(conn: AsyncConnection, key: str) -> dict[str, Any]:
    """The map of rows read ahead under ``key`` in ``conn.info`` (made empty when absent)."""
    found: dict[str, Any] | None = conn.info.get(key)
    if found is None:
        found = conn.info[key] = {}
    return found


READ_AHEAD_TABLES = ("jobs", "nodes")
"""Tables whose rows are read ahead (``seen_jobs``, ``seen_streaks``): a write to one
forgets what was read ahead."""


def forget_read_ahead(conn: AsyncConnection) -> None:
    """Forget the rows read ahead in this transaction (job rows and nodes' streaks)."""
    drop_read_ahead(conn.info)


def drop_read_ahead(info: dict[Any, Any]) -> None:
    """``forget_read_ahead`` on a connection's ``info`` (SQLAlchemy's events give that)."""
    info.pop(SEEN_JOBS, None)
    info.pop(SEEN_STREAKS, None)


class PgCodec:
    """One table's columns, its prebuilt statements, how to bind values and read rows."""

    def __init__(self, table: sa.Table) -> None:
        cols = list(table.columns)
        self.name = table.name
        self.names = tuple(c.name for c in cols)
        self.select_columns = tuple(_q(n) for n in self.names)
        self.select = f"SELECT {', '.join(self.select_columns)} FROM {_q(table.name)}"
        self._types = {c.name: c.type.compile(dialect=_DIALECT) for c in cols}
        self._json = frozenset(c.name for c in cols if isinstance(c.type, sa.JSON))
        self._bool = frozenset(c.name for c in cols if isinstance(c.type, sa.Boolean))
        self._defaults = {
            c.name: c.default.arg  # type: ignore[attr-defined]
            for c in cols
            if c.default is not None and c.default.is_scalar
        }
        self.row = namedtuple(f"{table.name}_pgrow", self.names)  # type: ignore[misc]
        self._updates: dict[tuple[str, tuple[str, ...]], str] = {}
        self._inserts: dict[tuple[str, ...], str] = {}
        self._by_key: dict[str, tuple[str, str]] = {}

    def decode(self, record: Any) -> Any:
        return self.row._make(record)  # type: ignore[attr-defined]

    def bind(self, name: str, value: Any) -> Any:
        if name in self._json:
            return dumps(value)
        if name in self._bool and value is not None:
            return bool(value)
        return value

    def _key_sql(self, column: str) -> tuple[str, str]:
        found = self._by_key.get(column)
        if found is None:
            one = f"{self.select} WHERE {_q(column)} = $1"
            # One index lookup per key (LATERAL ... LIMIT 1 is never flattened into a join):
            # "= ANY($1)" is planned as a scan of the whole table when the plan PostgreSQL
            # keeps for the prepared statement was made while the table was small.
            cols = ", ".join(f"t.{c}" for c in self.select_columns)
            many = (
                f"SELECT {cols} FROM unnest($1::{self._types[column]}[]) AS k(key) "
                f"CROSS JOIN LATERAL (SELECT * FROM {_q(self.name)} "
                f"WHERE {_q(column)} = k.key LIMIT 1) t"
            )
            found = self._by_key[column] = (one, many)
        return found

    async def by_keys(self, raw: Any, column: str, keys: Sequence[Any]) -> list[Any]:
        """Rows whose ``column`` (unique) is one of ``keys`` (any order, each row once)."""
        if not keys:
            return []
        one, many = self._key_sql(column)
        if len(keys) == 1:
            return [self.row._make(r) for r in await raw.fetch(one, keys[0])]  # type: ignore[attr-defined]
        unique = list(dict.fromkeys(keys))
        return [self.row._make(r) for r in await raw.fetch(many, unique)]  # type: ignore[attr-defined]

    async def where(self, raw: Any, clause: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of ``SELECT <all columns> <clause>`` (``$1``... placeholders)."""
        return [self.row._make(r) for r in await raw.fetch(f"{self.select} {clause}", *params)]  # type: ignore[attr-defined]

    async def insert(self, raw: Any, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert rows (each a dict of column values; missing columns get their defaults)."""
        batch = [self._defaults | dict(r) for r in rows]
        if not batch:
            return
        names = tuple(batch[0])
        sql = self._inserts.get(names)
        if sql is None:
            cols = ", ".join(_q(n) for n in names)
            marks = ", ".join(f"${i}" for i in range(1, len(names) + 1))
            sql = self._inserts[names] = f"INSERT INTO {_q(self.name)} ({cols}) VALUES ({marks})"
        args = [tuple(self.bind(n, r[n]) for n in names) for r in batch]
        if len(args) == 1:
            await raw.execute(sql, *args[0])
        else:  # one round trip: asyncpg pipelines the rows
            await raw.executemany(sql, args)

    async def guarded_update(
        self, raw: Any, key: tuple[str, Any], version: int, values: Mapping[str, Any]
    ) -> bool:
        """``UPDATE ... SET values, version+1 WHERE key AND version``; True when it matched."""
        column, value = key
        names = tuple(values)
        sql = self._updates.get((column, names))
        if sql is None:
            sets = "".join(f"{_q(n)} = ${i}, " for i, n in enumerate(names, 1))
            k = len(names) + 1
            sql = (
                f"UPDATE {_q(self.name)} SET {sets}version = version + 1 "
                f"WHERE {_q(column)} = ${k} AND version = ${k + 1}"
            )
            self._updates[(column, names)] = sql
        status = await raw.execute(sql, *(self.bind(n, values[n]) for n in names), value, version)
        return bool(status == "UPDATE 1")

    async def guarded_update_many(
        self, raw: Any, column: str, rows: Sequence[tuple[Any, int, Mapping[str, Any]]]
    ) -> set[Any]:
        """Many guarded updates in one statement: each row is (key, version, values), every
        ``values`` with the same columns; the keys whose row matched (as ``guarded_update``
        would have answered each, in one round trip instead of one each)."""
        if not rows:
            return set()
        names = tuple(rows[0][2])
        sql = self._updates.get((f"many:{column}", names))
        if sql is None:
            cols = (column, "version", *names)
            arrays = ", ".join(f"${i}::{self._types[n]}[]" for i, n in enumerate(cols, 1))
            alias = ", ".join(f"k{i}" for i in range(len(cols)))
            sets = "".join(f"{_q(n)} = k.k{i}, " for i, n in enumerate(names, 2))
            sql = (
                f"UPDATE {_q(self.name)} AS t SET {sets}version = t.version + 1 "
                f"FROM unnest({arrays}) AS k({alias}) "
                f"WHERE t.{_q(column)} = k.k0 AND t.version = k.k1 RETURNING t.{_q(column)}"
            )
            self._updates[(f"many:{column}", names)] = sql
        args = [[r[0] for r in rows], [r[1] for r in rows]]
        args += [[self.bind(n, r[2][n]) for r in rows] for n in names]
        return {r[0] for r in await raw.fetch(sql, *args)}


_CODECS: dict[str, PgCodec] = {}


def codec(table: sa.Table) -> PgCodec:
    found = _CODECS.get(table.name)
    if found is None:
        found = _CODECS[table.name] = PgCodec(table)
    return found


def _q(name: str) -> str:
    return f'"{name}"'
