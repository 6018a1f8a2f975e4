"""The append-only ``events`` table: it feeds SSE streams, audit and trace export."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.events import Event, EventKind
from corral.server.store import pgraw
from corral.server.store.jsontext import dumps
from corral.server.store.rawsql import codec, driver
from corral.server.store.tables import events

_RAW = codec(events)
_RAW_APPEND = "INSERT INTO events (kind, at, job_id, node, team, data) VALUES (?, ?, ?, ?, ?, ?)"
_RAW_APPEND_AT = (
    "INSERT INTO events (seq, kind, at, job_id, node, team, data) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SEQ_JUMP = 1_000_000
"""How far past the highest event on disk a SQLite server's first event after a start is
numbered. Events may reach readers before their commit is on disk (docs/server.md); a
power loss forgets those, and without the jump their numbers would be given to later
events, which a reader resuming after the last number it saw would then skip."""
_PG = pgraw.codec(events)
_PG_APPEND = (
    "INSERT INTO events (kind, at, job_id, node, team, data) "
    "VALUES ($1, $2, $3, $4, $5, $6) RETURNING seq"
)
# Several events in one statement; rows are inserted (and their seq drawn) in array order.
_PG_APPEND_MANY = (
    "INSERT INTO events (kind, at, job_id, node, team, data) SELECT * FROM unnest("
    "$1::varchar[], $2::float8[], $3::varchar[], $4::varchar[], $5::varchar[], $6::json[]) "
    "RETURNING seq"
)
_APPEND = sa.insert(events).returning(events.c.seq, sort_by_parameter_order=True)
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
    number the first event that far past the highest one in the table (``SEQ_JUMP``)."""
    if not batch:
        return []
    db = driver(conn)
    if db is not None:  # one writer holds the transaction: each row's rowid is its seq
        seqs = []
        cursor = db.cursor()
        for te in batch:
            e = te.event
            row = (e.kind.value, e.at, e.job_id, e.node, te.team, dumps(dict(e.data)))
            if jump:
                top = cursor.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
                cursor.execute(_RAW_APPEND_AT, (int(top) + jump, *row))
                jump = 0
            else:
                cursor.execute(_RAW_APPEND, row)
            seqs.append(int(cursor.lastrowid or 0))
        return seqs
    raw = pgraw.pg(conn)
    if raw is not None:
        return await _pg_append(raw, batch)
    rows = await conn.execute(
        _APPEND,
        [
            {
                "kind": te.event.kind.value,
                "at": te.event.at,
                "job_id": te.event.job_id,
                "node": te.event.node,
                "team": te.team,
                "data": dict(te.event.data),
            }
            for te in batch
        ],
    )
    return [r.seq for r in rows]


async def after(
    conn: AsyncConnection,
    seq: int,
    *,
    job_id: str | None = None,
    team: str | None = None,
    limit: int = 500,
) -> list[tuple[Event, str | None]]:
    """Events with ``seq`` greater than ``seq``, oldest first, with their team."""
    db = driver(conn)
    if db is not None:
        clause = "WHERE seq > ?" + (" AND job_id = ?" if job_id is not None else "")
        clause += (" AND team = ?" if team is not None else "") + " ORDER BY seq LIMIT ?"
        args = [seq, *(v for v in (job_id, team) if v is not None), limit]
        return [
            (Event(EventKind(r.kind), r.at, r.job_id, r.node, r.data or {}, r.seq), r.team)
            for r in _RAW.where(db, clause, args)
        ]
    raw = pgraw.pg(conn)
    if raw is not None:
        clause = "WHERE seq > $1" + (" AND job_id = $2" if job_id is not None else "")
        if team is not None:
            clause += f" AND team = ${2 + (job_id is not None)}"
        clause += f" ORDER BY seq LIMIT ${2 + (job_id is not None) + (team is not None)}"
        args = [seq, *(v for v in (job_id, team) if v is not None), limit]
        return [
            (Event(EventKind(r.kind), r.at, r.job_id, r.node, r.data or {}, r.seq), r.team)
            for r in await _PG.where(raw, clause, args)
        ]
    params = {"seq": seq, "limit": limit, "job_id": job_id, "team": team}
    rows = await conn.execute(_after(job_id is not None, team is not None), params)
    return [
        (Event(EventKind(r.kind), r.at, r.job_id, r.node, r.data or {}, r.seq), r.team)
        for r in rows
    ]


async def _pg_append(raw: Any, batch: Sequence[TeamEvent]) -> list[int]:
    """One round trip: a single row, or all of them through ``unnest``.

    The rows of the ``unnest`` insert are drawn from the arrays in order and
    each takes the next ``seq`` as it is inserted, so the returned seqs,
    sorted, are those of ``batch`` in order (RETURNING promises no order).
    """
    if len(batch) == 1:
        te = batch[0]
        e = te.event
        args = (e.kind.value, e.at, e.job_id, e.node, te.team, dumps(dict(e.data)))
        return [int(await raw.fetchval(_PG_APPEND, *args))]
    columns: tuple[list[Any], ...] = ([], [], [], [], [], [])
    kinds, ats, job_ids, nodes, teams, datas = columns
    for te in batch:
        e = te.event
        kinds.append(e.kind.value)
        ats.append(e.at)
        job_ids.append(e.job_id)
        nodes.append(e.node)
        teams.append(te.team)
        datas.append(dumps(dict(e.data)))
    return sorted(int(r[0]) for r in await raw.fetch(_PG_APPEND_MANY, *columns))


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
def _after(by_job: bool, by_team: bool) -> sa.Select[Any]:
    """The page query for one combination of filters, built once (SSE readers run it often)."""
    query = (
        sa.select(events)
        .where(events.c.seq > sa.bindparam("seq"))
        .order_by(events.c.seq)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    if by_job:
        query = query.where(events.c.job_id == sa.bindparam("job_id"))
    if by_team:
        query = query.where(events.c.team == sa.bindparam("team"))
    return query


async def last_seq(conn: AsyncConnection) -> int:
    return int((await conn.execute(sa.select(sa.func.max(events.c.seq)))).scalar() or 0)
