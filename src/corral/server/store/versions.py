"""What a scheduling cycle reads first (``loops/snapshot.py``): the versions of the queued
jobs, the active allocations and the nodes, and the teams: four narrow reads."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Team
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo


@dataclass(frozen=True, slots=True)
class Versions:
    queued: list[tuple[str, int]]  # (id, version) of each queued job, in submission order
    active: dict[str, int]  # allocation id -> version, of the active ones
    nodes: dict[str, int]  # node name -> version
    teams: list[Team]  # by name


async def read(conn: AsyncConnection, *, with_queued: bool = True) -> Versions:
    """``with_queued=False``: leave the queued jobs out (SQLite, when the cycle follows
    ``job_changes`` instead: ``loops/queue_view.py``)."""
    return Versions(
        await job_repo.queued_versions(conn) if with_queued else [],
        await alloc_repo.active_versions(conn),
        await node_repo.versions(conn),
        await node_repo.all_teams(conn),
    )
