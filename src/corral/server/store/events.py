"""The append-only ``events`` table: it feeds SSE streams, audit and trace export."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.events import Event, EventKind
from corral.server.store.sql import Query
from corral.server.store.tables import events

SEQ_JUMP = 1_000_000
"""How far past the highest event on disk a SQLite server's first event after a start is
numbered. Events may reach readers before their commit is on disk (docs/server.md); a
power loss forgets those, and without the jump their numbers would be given to later
events, which a reader resuming after the last number it saw would then skip."""
APPEND_ROWS = 64
"""Events per INSERT at most: a batch's events go in one statement (one round trip on
PostgreSQL) up to this many; a statement is compiled once per row count up to it."""
_COLUMNS = ("kind", "at", "job_id", "node", "team", "data")
# The first event after a start on SQLite, numbered SEQ_JUMP past the highest on disk.
_APPEND_JUMPED = Query(
    sa.insert(events)
    .values(
        seq=sa.select(sa.func.coalesce(sa.func.max(events.c.seq), 0)).scalar_subquery()
        + sa.bindparam("jump", type_=sa.BigInteger),
        **{c: sa.bindparam(c, type_=events.c[c].type) for c in _COLUMNS},
    )
    .returning(events.c.seq)
)
# PostgreSQL: the sequence moved SEQ_JUMP past its last value (0 if never drawn from, which
# is also what a crash leaves when it forgot every draw).
_PG_JUMP = (
    "SELECT setval(s, coalesce(pg_sequence_last_value(s), 0) + $1) "
    "FROM (SELECT pg_get_serial_sequence('events', 'seq')::regclass AS s) q"
)


@dataclass(frozen=True, slots=True)
class TeamEvent:
    """An event to append, with the team that may read it (None: admins only)."""

    event: Event
    team: str | None = None


async def append(conn: AsyncConnection, batch: Sequence[TeamEvent], *, jump: int = 0) -> list[int]:
    """Insert ``batch``; returns the ``seq`` each event got, in order. ``jump`` (SQLite):
    number the first event that far past the highest one in the table (``SEQ_JUMP``).

    The rows of one INSERT take their ``seq`` in the order they are listed, so the seqs
    it returns, sorted, are those of its rows in order (RETURNING promises no order).
    """
    seqs: list[int] = []
    if jump and batch:
        params = dict(zip(_COLUMNS, _values(batch[:1]), strict=True))
        first = await _APPEND_JUMPED.tuples(conn, jump=jump, **params)
        seqs.append(int(first[0][0]))
        batch = batch[1:]
    for at in range(0, len(batch), APPEND_ROWS):
        part = batch[at : at + APPEND_ROWS]
        params = dict(zip(_names(len(part)), _values(part), strict=True))
        seqs += sorted(int(r[0]) for r in await _append(len(part)).tuples(conn, **params))
    return seqs


def _values(batch: Sequence[TeamEvent]) -> list[Any]:
    """The column values of ``batch``, row after row, in ``_COLUMNS`` order."""
    return [
        value
        for te in batch
        for e in (te.event,)
        for value in (e.kind.value, e.at, e.job_id, e.node, te.team, dict(e.data))
    ]


@functools.cache
def _names(count: int) -> tuple[str, ...]:
    """The parameters of ``_append(count)``, row by row: ``kind_0``, ``at_0``, ..."""
    return tuple(f"{c}_{i}" for i in range(count) for c in _COLUMNS)


@functools.lru_cache(maxsize=APPEND_ROWS)
def _append(count: int) -> Query:
    """INSERT of ``count`` events (parameters ``kind_0``, ``at_0``, ... ``data_<count-1>``)."""
    values = [
        {c: sa.bindparam(f"{c}_{i}", type_=events.c[c].type) for c in _COLUMNS}
        for i in range(count)
    ]
    return Query(sa.insert(events).values(values).returning(events.c.seq))


async def after(
    conn: AsyncConnection,
    seq: int,
    *,
    job_id: str | None = None,
    team: str | None = None,
    limit: int = 500,
) -> list[tuple[Event, str | None]]:
    """Events with ``seq`` greater than ``seq``, oldest first, with their team."""
    params = {"seq": seq, "limit": limit, "job_id": job_id, "team": team}
    rows = await _after(job_id is not None, team is not None).rows(
        conn, **{k: v for k, v in params.items() if v is not None}
    )
    return [
        (Event(EventKind(r.kind), r.at, r.job_id, r.node, r.data or {}, r.seq), r.team)
        for r in rows
    ]


async def pg_mark_epoch(raw: Any) -> bool:
    """After a crash of PostgreSQL, move the event sequence past what it may have forgotten.

    Run inside a transaction holding the event-ordering lock, before the first
    event a connection appends. ``event_epoch`` (migration 0007) is unlogged:
    crash recovery empties it. Empty, the sequence is moved ``SEQ_JUMP`` past
    its last value (events of relaxed commits reach readers before their WAL is
    flushed, and a crash forgets them and the sequence's advance alike) and the
    marker written again, in a commit that waits for its WAL flush. A new
    database jumps too: after a crash that forgot every event, it looks the
    same. True if this call marked it.
    """
    if await raw.fetchval("SELECT EXISTS (SELECT 1 FROM event_epoch)"):
        return False
    # This commit waits for its WAL flush even in a relaxed write: a jump that a crash could
    # forget would let the next one start below numbers readers have seen.
    await raw.execute("SET LOCAL synchronous_commit TO on")
    await raw.execute(_PG_JUMP, SEQ_JUMP)
    await raw.execute("INSERT INTO event_epoch (marked_at) VALUES (extract(epoch FROM now()))")
    return True


@functools.cache
def _after(by_job: bool, by_team: bool) -> Query:
    """The page query for one combination of filters (SSE readers run it often)."""
    query = (
        sa.select(events)
        .where(events.c.seq > sa.bindparam("seq", type_=sa.BigInteger))
        .order_by(events.c.seq)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    if by_job:
        query = query.where(events.c.job_id == sa.bindparam("job_id"))
    if by_team:
        query = query.where(events.c.team == sa.bindparam("team"))
    return Query(query)


async def last_seq(conn: AsyncConnection) -> int:
    return int((await conn.execute(sa.select(sa.func.max(events.c.seq)))).scalar() or 0)
