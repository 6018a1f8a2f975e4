"""Queries on the ``nodes`` and ``teams`` tables."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Team, takes_work
from corral.core.states import NodeState
from corral.server.store import pgraw
from corral.server.store.guard import guarded_update
from corral.server.store.rawsql import codec, driver
from corral.server.store.records import NodeRecord, node_from_row, team_from_row
from corral.server.store.tables import nodes, teams

# Hot queries are built once (building a statement costs more than running it on SQLite).
_GET = sa.select(nodes).where(nodes.c.name == sa.bindparam("name"))
_VERSIONS = sa.select(nodes.c.name, nodes.c.version)
_TEAMS = sa.select(teams).order_by(teams.c.name)
_RAW = codec(nodes)
_RAW_TEAMS = codec(teams)
_PG = pgraw.codec(nodes)
_PG_TEAMS = pgraw.codec(teams)


async def get(conn: AsyncConnection, name: str) -> NodeRecord | None:
    db = driver(conn)
    if db is not None:
        rows = _RAW.by_keys(db, "name", [name])
        return node_from_row(rows[0]) if rows else None
    raw = pgraw.pg(conn)
    if raw is not None:
        rows = await _PG.by_keys(raw, "name", [name])
        return node_from_row(rows[0]) if rows else None
    row = (await conn.execute(_GET, {"name": name})).first()
    return node_from_row(row) if row else None


_SCHEDULABLE = sa.select(nodes.c.state, nodes.c.paused, nodes.c.draining).where(
    nodes.c.name == sa.bindparam("name")
)
_RAW_SCHEDULABLE = "SELECT state, paused, draining FROM nodes WHERE name = ?"
_PG_SCHEDULABLE = "SELECT state, paused, draining FROM nodes WHERE name = $1"


async def schedulable(conn: AsyncConnection, name: str) -> bool:
    """Whether node ``name`` exists and takes work (``Node.schedulable``), from its flags
    alone: a placement checks it for every node it uses, and a whole row decodes the
    node's inventory JSON for nothing."""
    db = driver(conn)
    if db is not None:
        row = db.execute(_RAW_SCHEDULABLE, (name,)).fetchone()
    elif (raw := pgraw.pg(conn)) is not None:
        row = await raw.fetchrow(_PG_SCHEDULABLE, name)
    else:
        row = (await conn.execute(_SCHEDULABLE, {"name": name})).first()
    if row is None:
        return False
    state, paused, draining = row
    return takes_work(NodeState(state), paused=bool(paused), draining=bool(draining))


async def all_nodes(conn: AsyncConnection) -> list[NodeRecord]:
    return [node_from_row(r) for r in await conn.execute(sa.select(nodes).order_by(nodes.c.name))]


async def held_by_token(conn: AsyncConnection, token_id: str) -> int:
    """How many node names the join token ``token_id`` holds (nodes its agents joined)."""
    query = sa.select(sa.func.count()).select_from(nodes).where(nodes.c.token_id == token_id)
    return int((await conn.execute(query)).scalar_one())


async def lost_of_token(conn: AsyncConnection, token_id: str, limit: int) -> list[str]:
    """Up to ``limit`` lost nodes that ``token_id`` admitted, the longest silent first."""
    query = (
        sa.select(nodes.c.name)
        .where(nodes.c.token_id == token_id, nodes.c.state == NodeState.LOST.value)
        .order_by(nodes.c.last_seen, nodes.c.name)
        .limit(limit)
    )
    return [r.name for r in await conn.execute(query)]


async def versions(conn: AsyncConnection) -> dict[str, int]:
    db = driver(conn)
    if db is not None:
        return dict(db.execute("SELECT name, version FROM nodes"))
    raw = pgraw.pg(conn)
    if raw is not None:
        return {r[0]: r[1] for r in await raw.fetch("SELECT name, version FROM nodes")}
    return {r.name: r.version for r in await conn.execute(_VERSIONS)}


async def get_many(conn: AsyncConnection, names: list[str]) -> list[NodeRecord]:
    if not names:
        return []
    db = driver(conn)
    if db is not None:
        return [node_from_row(r) for r in _RAW.by_keys(db, "name", names)]
    raw = pgraw.pg(conn)
    if raw is not None:
        return [node_from_row(r) for r in await _PG.by_keys(raw, "name", names)]
    rows = await conn.execute(sa.select(nodes).where(nodes.c.name.in_(names)))
    return [node_from_row(r) for r in rows]


async def insert(conn: AsyncConnection, **values: Any) -> None:
    await conn.execute(sa.insert(nodes).values(**values, version=1))


async def update(conn: AsyncConnection, rec: NodeRecord, **values: Any) -> bool:
    """Guarded by ``rec.version``."""
    return await guarded_update(conn, nodes, ("name", rec.node.name), rec.version, values)


async def delete(conn: AsyncConnection, name: str) -> bool:
    """Forget a node (the autoscaler removed its machine); False when it was not there."""
    result = await conn.execute(sa.delete(nodes).where(nodes.c.name == name))
    return bool(result.rowcount)


_RESET_STREAK = (
    sa.update(nodes)
    .where(nodes.c.name == sa.bindparam("k_name"), nodes.c.failure_streak != 0)
    .values(failure_streak=0, version=nodes.c.version + 1)
)
_RAW_RESET_STREAK = (
    "UPDATE nodes SET failure_streak = 0, version = version + 1 "
    "WHERE name = {} AND failure_streak <> 0"
)


async def reset_streak(conn: AsyncConnection, name: str) -> None:
    """A job succeeded on ``name``: its count of failures in a row goes back to 0.

    One statement, no read first: it changes the row (and its version) only when
    the count is not 0 already. On PostgreSQL not even that when the allocation's read
    in this transaction saw the count at 0 (``pgraw.seen_streaks``).
    """
    db = driver(conn)
    if db is not None:
        db.execute(_RAW_RESET_STREAK.format("?"), (name,))
        return
    raw = pgraw.pg(conn)
    if raw is not None:
        seen = pgraw.seen_streaks(conn)
        if seen.get(name) != 0:  # read as 0 in this transaction: nothing to reset
            await raw.execute(_RAW_RESET_STREAK.format("$1"), name)
            seen[name] = 0
        return
    await conn.execute(_RESET_STREAK, {"k_name": name})


async def touch(conn: AsyncConnection, name: str, at: float) -> bool:
    """Record a heartbeat. Unguarded on purpose: ``last_seen`` only moves forward."""
    result = await conn.execute(
        sa.update(nodes).where(nodes.c.name == name, nodes.c.last_seen < at).values(last_seen=at)
    )
    return bool(result.rowcount == 1)


async def all_teams(conn: AsyncConnection) -> list[Team]:
    db = driver(conn)
    if db is not None:
        return [team_from_row(r) for r in _RAW_TEAMS.where(db, "ORDER BY name")]
    raw = pgraw.pg(conn)
    if raw is not None:
        return [team_from_row(r) for r in await _PG_TEAMS.where(raw, "ORDER BY name")]
    return [team_from_row(r) for r in await conn.execute(_TEAMS)]


async def get_team(conn: AsyncConnection, name: str) -> Team | None:
    row = (await conn.execute(sa.select(teams).where(teams.c.name == name))).first()
    return team_from_row(row) if row else None


async def put_team(conn: AsyncConnection, team: Team, at: float) -> None:
    """Create or replace a team's quota, borrow limit and weight."""
    values = {
        "quota_gpus": team.quota_gpus,
        "borrow_limit_gpus": team.borrow_limit_gpus,
        "weight": team.weight,
        "updated_at": at,
    }
    changed = await conn.execute(sa.update(teams).where(teams.c.name == team.name).values(values))
    if changed.rowcount == 0:
        await conn.execute(sa.insert(teams).values(name=team.name, **values))


async def ensure_teams(conn: AsyncConnection, names: set[str], at: float) -> None:
    """Create default rows for teams first named by a submission or a token."""
    if not names:
        return
    rows = await conn.execute(sa.select(teams.c.name).where(teams.c.name.in_(sorted(names))))
    missing = names - {r.name for r in rows}
    for name in sorted(missing):
        await conn.execute(
            sa.insert(teams).values(name=name, quota_gpus=0.0, weight=1.0, updated_at=at)
        )
