"""What a scheduling cycle reads first (``loops/changes.py``): the versions of the queued
jobs, the active allocations and the nodes, and the teams.

On PostgreSQL this is one query, one round trip instead of four: in the
stamped idle round trip (``bench/e2e_steps.py --db``) the snapshot took
1.4 ms, most of it the four round trips with asyncpg's work around each. The
query has each part aggregate its rows into one JSON array, the same rows in
the same order as the four reads. On SQLite (and through SQLAlchemy) it is
the four reads: inline, each costs a few microseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Team
from corral.core.states import JobState
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store import pgraw

_PG_ALL = """
SELECT
  (SELECT coalesce(json_agg(json_build_array(id, version) ORDER BY seq), '[]'::json)
     FROM jobs WHERE state = $1),
  (SELECT coalesce(json_agg(json_build_array(id, version)), '[]'::json)
     FROM allocations WHERE active),
  (SELECT coalesce(json_agg(json_build_array(name, version)), '[]'::json) FROM nodes),
  (SELECT coalesce(json_agg(json_build_array(name, quota_gpus, borrow_limit_gpus, weight)
                            ORDER BY name), '[]'::json) FROM teams)
"""


@dataclass(frozen=True, slots=True)
class Versions:
    queued: list[tuple[str, int]]  # (id, version) of each queued job, in submission order
    active: dict[str, int]  # allocation id -> version, of the active ones
    nodes: dict[str, int]  # node name -> version
    teams: list[Team]  # by name


async def read(conn: AsyncConnection, *, with_queued: bool = True) -> Versions:
    """``with_queued=False``: leave the queued jobs out (SQLite, when the cycle follows
    ``job_changes`` instead: ``loops/queue_view.py``)."""
    raw = pgraw.pg(conn)
    if raw is None:
        return Versions(
            await job_repo.queued_versions(conn) if with_queued else [],
            await alloc_repo.active_versions(conn),
            await node_repo.versions(conn),
            await node_repo.all_teams(conn),
        )
    queued, active, nodes, teams = (
        _json(v) for v in await raw.fetchrow(_PG_ALL, JobState.QUEUED.value)
    )
    return Versions(
        [(job_id, version) for job_id, version in queued],
        {alloc_id: version for alloc_id, version in active},
        {name: version for name, version in nodes},
        [Team(name=n, quota_gpus=q, borrow_limit_gpus=b, weight=w) for n, q, b, w in teams],
    )


def _json(value: Any) -> Any:
    """A ``json`` column's value: decoded already when the connection has a codec for it."""
    return json.loads(value) if isinstance(value, str) else value
