"""``GET /v1/autoscaler``: the pools, the machines the provider runs, and the last decision."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.providers import pool_to_json

router = APIRouter(prefix="/v1", responses=ERRORS)


class PoolOut(BaseModel):
    name: str
    gpus: int
    gpu_model: str
    vram_bytes: int
    cpus: int
    labels: dict[str, str]
    backends: list[str]
    min_nodes: int
    max_nodes: int
    cost_per_hour: float
    backoff_until: float | None = Field(None, description="no launches until then")


class MemberOut(BaseModel):
    name: str = Field(description="the node name its agent joins as")
    pool: str
    launched_at: float


class DecisionOut(BaseModel):
    at: float
    members: list[MemberOut]
    launches: list[dict[str, Any]]
    drain: list[str]
    undrain: list[str]
    remove: list[dict[str, Any]]
    unmet: list[dict[str, Any]] = Field(description="waiting jobs no launch serves, and why")


class AutoscalerOut(BaseModel):
    enabled: bool
    pools: list[PoolOut] = []
    last: DecisionOut | None = Field(
        None, description="the leader's last decision (null: none yet, or not the leader)"
    )


@router.get("/autoscaler", response_model=AutoscalerOut, tags=["nodes"])
async def autoscaler(plane: Plane, who: Caller) -> AutoscalerOut:
    """What the autoscaler runs and decided last (admin; docs/autoscaler.md)."""
    who.require_admin("see the autoscaler")
    loop = plane.autoscale
    if loop is None:
        return AutoscalerOut(enabled=False, last=None)
    pools = [PoolOut(**pool_to_json(p), backoff_until=loop.backoff.get(p.name)) for p in loop.pools]
    last = loop.last
    if last is None:
        return AutoscalerOut(enabled=True, pools=pools, last=None)
    decided = last.reply.to_json()
    del decided["backoff"]
    members = [MemberOut(name=m.name, pool=m.pool, launched_at=m.launched_at) for m in last.members]
    return AutoscalerOut(
        enabled=True, pools=pools, last=DecisionOut(at=last.at, members=members, **decided)
    )
