"""Queries on the ``nodes`` and ``teams`` tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Gpu, Team, takes_work
from corral.core.states import NodeState
from corral.server.store.guard import guarded_update
from corral.server.store.records import (
    NodeRecord,
    gpu_live_to_json,
    node_from_row,
    team_from_row,
)
from corral.server.store.sql import Query, rows_by_keys
from corral.server.store.tables import nodes, teams

_NAME: sa.BindParameter[str] = sa.bindparam("name", type_=sa.String)
_GET = Query(sa.select(nodes).where(nodes.c.name == _NAME))
_GET_MANY = Query(rows_by_keys(nodes, "name"))
_VERSIONS = Query(sa.select(nodes.c.name, nodes.c.version))
_TEAMS = Query(sa.select(teams).order_by(teams.c.name))
_SCHEDULABLE = Query(
    sa.select(nodes.c.state, nodes.c.paused, nodes.c.draining).where(nodes.c.name == _NAME)
)
_RESET_STREAK = Query(
    sa.update(nodes)
    .where(nodes.c.name == _NAME, nodes.c.failure_streak != sa.literal_column("0"))
    .values(failure_streak=sa.literal_column("0"), version=nodes.c.version + sa.literal_column("1"))
)


async def get(conn: AsyncConnection, name: str) -> NodeRecord | None:
    row = await _GET.first(conn, name=name)
    return node_from_row(row) if row else None


async def schedulable(conn: AsyncConnection, name: str) -> bool:
    """Whether node ``name`` exists and takes work (``Node.schedulable``), from its flags
    alone: a placement checks it for every node it uses, and a whole row decodes the
    node's inventory JSON for nothing."""
    row = await _SCHEDULABLE.first(conn, name=name)
    if row is None:
        return False
    return takes_work(NodeState(row.state), paused=bool(row.paused), draining=bool(row.draining))


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
    return {r.name: r.version for r in await _VERSIONS.rows(conn)}


async def get_many(conn: AsyncConnection, names: list[str]) -> list[NodeRecord]:
    if not names:
        return []
    rows = await _GET_MANY.rows(conn, keys=list(dict.fromkeys(names)))
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


async def reset_streak(conn: AsyncConnection, name: str) -> None:
    """A job succeeded on ``name``: its count of failures in a row goes back to 0.

    One statement, no read first: it changes the row (and its version) only when
    the count is not 0 already.
    """
    await _RESET_STREAK.run(conn, name=name)


async def touch(
    conn: AsyncConnection, name: str, at: float, gpus: Sequence[Gpu] | None = None
) -> bool:
    """Record a heartbeat, and the live figures of ``gpus`` when it carried them.
    Unguarded on purpose: ``last_seen`` only moves forward, and the figures with it."""
    values: dict[str, Any] = {"last_seen": at}
    if gpus is not None:
        values["gpu_live"] = gpu_live_to_json(gpus)
    result = await conn.execute(
        sa.update(nodes).where(nodes.c.name == name, nodes.c.last_seen < at).values(values)
    )
    return bool(result.rowcount == 1)


async def all_teams(conn: AsyncConnection) -> list[Team]:
    return [team_from_row(r) for r in await _TEAMS.rows(conn)]


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
