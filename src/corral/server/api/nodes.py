"""``/v1/nodes``, ``/v1/teams`` and ``/v1/queue``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from corral.core.model import Team
from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.render import (
    NodeOut,
    QueueEntryOut,
    QueueOut,
    TeamIn,
    TeamOut,
    held_info,
    job_out,
    node_out,
    queue_info,
    team_out,
)
from corral.server.api.schemas import Name

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/nodes", response_model=list[NodeOut], tags=["nodes"])
async def list_nodes(plane: Plane, who: Caller) -> list[NodeOut]:
    """Every node with its GPUs, state and the allocations it holds (a team token sees
    other teams' allocations without their job ids)."""
    return [node_out(v) for v in await plane.nodes.listing(who)]


@router.get("/nodes/{name}", response_model=NodeOut, tags=["nodes"])
async def get_node(name: str, plane: Plane, who: Caller) -> NodeOut:
    return node_out(await plane.nodes.get(who, name))


@router.post("/nodes/{name}/pause", response_model=NodeOut, tags=["nodes"])
async def pause_node(name: str, plane: Plane, who: Caller) -> NodeOut:
    """No new work on this node; what runs keeps running (admin)."""
    return node_out(await plane.nodes.pause(who, name))


@router.post("/nodes/{name}/resume", response_model=NodeOut, tags=["nodes"])
async def resume_node(name: str, plane: Plane, who: Caller) -> NodeOut:
    """Take new work again; clears paused and draining (admin)."""
    return node_out(await plane.nodes.resume(who, name))


@router.post("/nodes/{name}/drain", response_model=NodeOut, tags=["nodes"])
async def drain_node(name: str, plane: Plane, who: Caller) -> NodeOut:
    """No new work; the node can be removed once its allocations end (admin)."""
    return node_out(await plane.nodes.drain(who, name))


@router.delete("/nodes/{name}", status_code=204, tags=["nodes"])
async def delete_node(name: str, plane: Plane, who: Caller) -> Response:
    """Forget a node that is gone: lost, with no work left (admin). 409 for a node that is
    not lost (its agent is connected, or was heard from within the node timeout)."""
    await plane.nodes.delete(who, name)
    return Response(status_code=204)


@router.get("/teams", response_model=list[TeamOut], tags=["teams"])
async def list_teams(plane: Plane, who: Caller) -> list[TeamOut]:
    """Teams with their quota (admin: all; a team token: its own)."""
    return [team_out(t) for t in await plane.nodes.teams(who)]


@router.put("/teams/{name}", response_model=TeamOut, tags=["teams"])
async def put_team(name: Name, body: TeamIn, plane: Plane, who: Caller) -> TeamOut:
    """Create or change a team's guaranteed GPUs, borrowing limit and weight (admin)."""
    team = Team(name, body.quota_gpus, body.borrow_limit_gpus, body.weight)
    return team_out(await plane.nodes.put_team(who, team))


@router.get("/queue", response_model=QueueOut, tags=["queue"])
async def queue(
    plane: Plane, who: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> QueueOut:
    """Queued jobs in the order the scheduler considers them, each with why it waits and
    when it is expected to start (``job.eta``)."""
    entries, total = await plane.queue.queue(who, limit)
    said = await plane.waits.said()
    return QueueOut(
        total=total,
        entries=[
            QueueEntryOut(
                job=job_out(e.job, queued=False, eta=said.eta(e.job.job.id)),
                position=e.position,
                queue=held_info(e.position) if e.job.held else queue_info(e.unplaced, e.position),
            )
            for e in entries
        ],
    )
