"""One path for every statement the store runs on the job path.

Each such statement is written once, as SQLAlchemy Core, and wrapped in a
``Query``: compiled once per database (SQLite and PostgreSQL), then run
straight on the driver connection under the store's ``AsyncConnection``
(``sqlite3`` inline, or asyncpg inside the transaction ``Database`` runs).
SQLAlchemy's own execution (execution context, parameter and result
processing per statement) cost more than the statements themselves on the
job path: 30-50 us each on SQLite, whose statements take 2-5 us, and a job
runs about twenty. Statements off the job path (pages, tokens, audit,
retention) go through ``conn.execute`` as ordinary SQLAlchemy.

Values are bound and read back as SQLAlchemy's types would: JSON columns as
JSON text (``jsontext.dumps``; ``None`` as ``'null'``), booleans as booleans.
Rows come back as named tuples with the statement's column names, so
``records`` converts them as it would SQLAlchemy rows.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import GenericFunction

from corral.server.store.jsontext import dumps
from corral.server.store.sqlite_inline import InlineConnection

RAW = "autocommit"
"""The asyncpg adapter's isolation level while ``Database`` runs the transaction itself:
SQLAlchemy then sends no ``BEGIN`` of its own, and the driver connection is handed out."""

_DIALECTS: dict[str, sa.Dialect] = {
    "sqlite": sqlite.dialect(),
    "postgresql": postgresql.asyncpg.dialect(),  # type: ignore[no-untyped-call]
}


class NotRunByStore(RuntimeError):
    """A store statement was given a connection ``Database`` does not run."""


def driver(conn: AsyncConnection) -> tuple[str, Any]:
    """(dialect name, driver connection) under ``conn``, a connection from ``Database``."""
    sync = conn.sync_connection
    fairy = None if sync is None else sync._dbapi_connection  # None once given back
    adapted: Any = None if fairy is None else fairy.dbapi_connection
    inner = getattr(adapted, "_connection", None)
    if isinstance(inner, InlineConnection):
        return "sqlite", inner._conn
    if inner is not None and getattr(adapted, "isolation_level", None) == RAW:
        return "postgresql", inner
    raise NotRunByStore("store statements run on connections from Database.read or .write")


def sqlite_connection(conn: AsyncConnection) -> sqlite3.Connection | None:
    """The ``sqlite3`` connection under ``conn`` (None on PostgreSQL): for what only SQLite
    keeps (the queue's change log of migration 0006)."""
    name, raw = driver(conn)
    return raw if name == "sqlite" else None


async def plain(conn: AsyncConnection, text: str) -> None:
    """Run a statement without parameters or rows (``SAVEPOINT``) on the driver connection:
    inside the transaction ``Database`` runs, where SQLAlchemy's ``begin_nested`` would
    first run its own bookkeeping."""
    name, raw = driver(conn)
    if name == "sqlite":
        raw.execute(text)
    else:
        await raw.execute(text)


class each_key(GenericFunction[Any]):
    """The elements of a JSON array given as one parameter, as rows of one column ``value``.

    Rows by many keys use it (``rows_by_keys``): one statement for any number of keys,
    where ``IN (...)`` would be a new statement for each count.
    """

    name = "each_key"
    inherit_cache = True


@compiles(each_key, "sqlite")
def _each_key_sqlite(element: each_key, compiler: Any, **kw: Any) -> str:
    return f"json_each({compiler.process(element.clauses, **kw)})"


@compiles(each_key, "postgresql")
def _each_key_pg(element: each_key, compiler: Any, **kw: Any) -> str:
    return f"json_array_elements_text({compiler.process(element.clauses, **kw)})"


def rows_by_keys(table: sa.Table, column: str) -> dict[str, sa.Select[Any]]:
    """Rows of ``table`` whose unique ``column`` is one of the JSON array ``:keys``, as a
    statement per database: the one place where the two need different SQL.

    On PostgreSQL a lateral subquery per key (``LIMIT 1``: never flattened into a join)
    keeps every key one index lookup even in the plan PostgreSQL caches for the prepared
    statement while the table was small (as a join or ``IN``, that plan scans the whole
    table, and is kept). SQLite has no lateral subqueries, and plans the join as a
    lookup per key anyway.
    """
    keys = each_key(sa.bindparam("keys", type_=sa.JSON)).table_valued("value").alias("k")
    one = (
        sa.select(table)
        .where(table.c[column] == keys.c.value)
        .limit(sa.literal_column("1"))
        .lateral("t")
    )
    return {
        "postgresql": sa.select(one).select_from(keys).join(one, sa.true()),
        "sqlite": sa.select(table).select_from(keys).join(table, table.c[column] == keys.c.value),
    }


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    binds: tuple[tuple[str, Callable[[Any], Any] | None], ...]  # name, encoder
    constants: dict[str, Any]  # values the statement holds itself (``version + 1``)
    decoders: tuple[tuple[int, Callable[[Any], Any]], ...]  # column index, decoder
    row: Any  # a named tuple type, or None when the statement returns no rows


class Query:
    """One statement, compiled once per database and run on the driver connection."""

    def __init__(
        self,
        statement: sa.ClauseElement | Mapping[str, sa.ClauseElement],
        *,
        column_keys: Sequence[str] = (),
    ) -> None:
        """``statement``: one for both databases, or one per database (``rows_by_keys``)."""
        if isinstance(statement, Mapping):
            self._statements = dict(statement)
        else:
            self._statements = dict.fromkeys(_DIALECTS, statement)
        self._column_keys = list(column_keys) or None
        self._compiled: dict[str, _Compiled] = {}

    def sql(self, dialect: str) -> str:
        """The statement's text on ``dialect`` ("sqlite" or "postgresql")."""
        return (self._compiled.get(dialect) or self._compile(dialect)).sql

    async def rows(self, conn: AsyncConnection, **params: Any) -> list[Any]:
        name, raw = driver(conn)
        c = self._compiled.get(name) or self._compile(name)
        args = _args(c, params)
        if name == "sqlite":
            found: Sequence[Any] = raw.execute(c.sql, args).fetchall()
        else:
            found = await raw.fetch(c.sql, *args)
        if not c.decoders:
            return [c.row._make(r) for r in found]
        return [_decoded(c, r) for r in found]

    async def tuples(self, conn: AsyncConnection, **params: Any) -> Sequence[Sequence[Any]]:
        """The rows as the driver gives them (tuples, undecoded): for narrow reads of many
        rows (every queued job's version), where a named tuple each costs more than the
        statement."""
        name, raw = driver(conn)
        c = self._compiled.get(name) or self._compile(name)
        args = _args(c, params)
        if name == "sqlite":
            found: Sequence[Any] = raw.execute(c.sql, args).fetchall()
            return found
        return await raw.fetch(c.sql, *args)  # type: ignore[no-any-return]

    async def first(self, conn: AsyncConnection, **params: Any) -> Any | None:
        found = await self.rows(conn, **params)
        return found[0] if found else None

    async def run(self, conn: AsyncConnection, **params: Any) -> int:
        """Run a statement that returns no rows; how many rows it changed."""
        name, raw = driver(conn)
        c = self._compiled.get(name) or self._compile(name)
        args = _args(c, params)
        if name == "sqlite":
            return int(raw.execute(c.sql, args).rowcount)
        status = await raw.execute(c.sql, *args)  # "UPDATE 3", "INSERT 0 1"
        return int(status.rsplit(" ", 1)[-1])

    async def run_many(self, conn: AsyncConnection, batch: Sequence[Mapping[str, Any]]) -> None:
        """Run the statement once per parameter set (asyncpg sends them in one round trip)."""
        name, raw = driver(conn)
        c = self._compiled.get(name) or self._compile(name)
        args = [_args(c, p) for p in batch]
        if name == "sqlite":
            raw.executemany(c.sql, args)
        elif len(args) == 1:
            await raw.execute(c.sql, *args[0])
        elif args:
            await raw.executemany(c.sql, args)

    def _compile(self, name: str) -> _Compiled:
        statement = self._statements[name]
        compiled: Any = statement.compile(dialect=_DIALECTS[name], column_keys=self._column_keys)
        keys = compiled.positiontup or ()
        binds = tuple((key, _encoder(compiled.binds[key].type, name)) for key in keys)
        constants = {k: compiled.binds[k].value for k in keys if not compiled.binds[k].required}
        columns = list(getattr(statement, "exported_columns", ()))
        decoders = tuple(
            (i, d) for i, c in enumerate(columns) if (d := _decoder(c.type, name)) is not None
        )
        row = namedtuple("Row", [c.name for c in columns]) if columns else None
        found = self._compiled[name] = _Compiled(str(compiled), binds, constants, decoders, row)
        return found


async def insert_rows(
    conn: AsyncConnection, table: sa.Table, rows: Sequence[Mapping[str, Any]]
) -> None:
    """Insert ``rows`` (dicts of column values, every one with the same columns; columns
    left out get their scalar defaults) in one ``run_many``."""
    if not rows:
        return
    defaults = _defaults(table)
    batch = [defaults | dict(r) for r in rows]
    await _insert(table, tuple(batch[0])).run_many(conn, batch)


@functools.lru_cache(maxsize=64)
def _insert(table: sa.Table, names: tuple[str, ...]) -> Query:
    return Query(sa.insert(table), column_keys=names)


@functools.cache
def _defaults(table: sa.Table) -> dict[str, Any]:
    return {
        c.name: c.default.arg  # type: ignore[attr-defined]
        for c in table.columns
        if c.default is not None and c.default.is_scalar
    }


def _args(c: _Compiled, params: Mapping[str, Any]) -> list[Any]:
    """The statement's parameters in its order, encoded for the driver."""
    if c.constants:
        params = c.constants | dict(params)
    return [params[k] if encode is None else encode(params[k]) for k, encode in c.binds]


def _decoded(c: _Compiled, raw: Sequence[Any]) -> Any:
    values = list(raw)
    for i, decode in c.decoders:
        if values[i] is not None:
            values[i] = decode(values[i])
    return c.row._make(values)


def _encoder(type_: Any, dialect: str) -> Callable[[Any], Any] | None:
    if isinstance(type_, sa.JSON):
        return dumps
    if isinstance(type_, sa.Boolean) and dialect == "postgresql":
        return _bool
    return None


def _decoder(type_: Any, dialect: str) -> Callable[[Any], Any] | None:
    """SQLite hands back JSON as text and booleans as 0/1; asyncpg decodes both itself
    (SQLAlchemy's dialect gave the connection its JSON codec)."""
    if dialect != "sqlite":
        return None
    if isinstance(type_, sa.JSON):
        return json.loads
    if isinstance(type_, sa.Boolean):
        return bool
    return None


def _bool(value: Any) -> Any:
    return None if value is None else bool(value)
