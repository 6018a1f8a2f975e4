"""What a scheduling cycle reads first (``loops/changes.py``): the versions of the queued
jobs, the active allocations and the nodes, and the teams.

One statement (four narrow reads joined by ``UNION ALL``, each row tagged with the
part it belongs to), so PostgreSQL answers it in one round trip instead of four.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Team
from corral.core.states import JobState
from corral.server.store.sql import Query
from corral.server.store.tables import allocations, jobs, nodes, teams


@dataclass(frozen=True, slots=True)
class Versions:
    queued: list[tuple[str, int]]  # (id, version) of each queued job, in submission order
    active: dict[str, int]  # allocation id -> version, of the active ones
    nodes: dict[str, int]  # node name -> version
    teams: list[Team]  # by name


def _part(
    tag: str, key: Any, version: Any, order: Any, team: tuple[Any, Any, Any] | None = None
) -> sa.Select[Any]:
    """One part's rows as (part, key, version, order, quota, borrow limit, weight)."""
    quota, borrow, weight = team or (sa.null(), sa.null(), sa.null())
    return sa.select(
        sa.literal_column(f"'{tag}'", sa.String).label("part"),
        sa.cast(key, sa.String).label("key"),
        sa.cast(version, sa.Integer).label("version"),
        sa.cast(order, sa.BigInteger).label("ord"),
        sa.cast(quota, sa.Double).label("quota"),
        sa.cast(borrow, sa.Double).label("borrow"),
        sa.cast(weight, sa.Double).label("weight"),
    )


_QUEUED = _part("q", jobs.c.id, jobs.c.version, jobs.c.seq).where(
    jobs.c.state == sa.bindparam("queued", type_=sa.String)
)
_REST = (
    _part("a", allocations.c.id, allocations.c.version, sa.null()).where(
        allocations.c.active == sa.true()
    ),
    _part("n", nodes.c.name, nodes.c.version, sa.null()),
    _part(
        "t",
        teams.c.name,
        sa.null(),
        sa.null(),
        (teams.c.quota_gpus, teams.c.borrow_limit_gpus, teams.c.weight),
    ),
)
_ORDER = ("part", "ord", "key")  # queued jobs by submission order, teams by name
_WITH_QUEUED = Query(sa.union_all(_QUEUED, *_REST).order_by(*_ORDER))
_WITHOUT_QUEUED = Query(sa.union_all(*_REST).order_by(*_ORDER))


async def read(conn: AsyncConnection, *, with_queued: bool = True) -> Versions:
    """``with_queued=False``: leave the queued jobs out (SQLite, when the cycle follows
    ``job_changes`` instead: ``loops/queue_view.py``)."""
    if with_queued:
        rows = await _WITH_QUEUED.tuples(conn, queued=JobState.QUEUED.value)
    else:
        rows = await _WITHOUT_QUEUED.tuples(conn)
    found = Versions([], {}, {}, [])
    queued, active, nodes_ = found.queued.append, found.active, found.nodes
    for part, key, version, _, quota, borrow, weight in rows:
        if part == "q":
            queued((key, version))
        elif part == "a":
            active[key] = version
        elif part == "n":
            nodes_[key] = version
        else:
            found.teams.append(Team(key, quota, borrow, weight))
    return found
