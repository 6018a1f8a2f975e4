"""``GET /v1/autoscaler``: the pools and their machines, what they cost against the caps, the
recent decisions with their reasons, and the last decision in full."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from corral.autoscaler import Pool
from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.loops.autoscale import AutoscaleLoop
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
    max_spend_per_hour: float | None = Field(None, description="the pool's spend cap per hour")
    provider: str = Field("", description="the provider that starts its machines")
    fixed: bool = Field(False, description="a fixed set of machines: never started or stopped")
    backoff_until: float | None = Field(None, description="no launches until then")
    machines: dict[str, int] = Field(
        default_factory=dict, description="its machines by state: launching, joined, draining"
    )
    cost_per_hour_now: float = Field(0.0, description="what its machines cost per hour now")
    spent_last_hour: float = Field(0.0, description="what its machines cost in the last hour")


class MemberOut(BaseModel):
    name: str = Field(description="the node name its agent joins as")
    pool: str
    launched_at: float


class MachineOut(BaseModel):
    name: str
    pool: str
    state: str = Field(
        description="launching (asked for, not joined), joined, draining, lost, terminating "
        "(terminated, still listed by its provider)"
    )
    launched_at: float


class SpendOut(BaseModel):
    cost_per_hour_now: float = Field(description="all machines, running and launching")
    spent_last_hour: float
    max_spend_per_hour: float | None = Field(description="the overall cap (null: none)")


class DecisionLines(BaseModel):
    at: float
    lines: list[str] = Field(description='e.g. "launch 1 x g4090: 3 jobs waited 30 s"')


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
    machines: list[MachineOut] = []
    spend: SpendOut | None = None
    decisions: list[DecisionLines] = Field(
        default_factory=list, description="the recent decisions that did something, oldest first"
    )
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
    last = loop.last
    states = dict(last.states) if last else {}
    pools = [_pool(loop, p, states) for p in loop.pools]
    spend = loop.spend
    totals = SpendOut(
        cost_per_hour_now=sum(spend.rate.values()),
        spent_last_hour=sum(spend.last_hour.values()),
        max_spend_per_hour=spend.cap,
    )
    decisions = [DecisionLines(at=d.at, lines=list(d.lines)) for d in loop.history]
    if last is None:
        return AutoscalerOut(
            enabled=True, pools=pools, spend=totals, decisions=decisions, last=None
        )
    machines = [
        MachineOut(name=m.name, pool=m.pool, state=states[m.name], launched_at=m.launched_at)
        for m in last.members
    ]
    decided = last.reply.to_json()
    del decided["backoff"]
    members = [MemberOut(name=m.name, pool=m.pool, launched_at=m.launched_at) for m in last.members]
    return AutoscalerOut(
        enabled=True,
        pools=pools,
        machines=machines,
        spend=totals,
        decisions=decisions,
        last=DecisionOut(at=last.at, members=members, **decided),
    )


def _pool(loop: AutoscaleLoop, pool: Pool, states: dict[str, str]) -> PoolOut:
    machines: dict[str, int] = {}
    for m in loop.last.members if loop.last else ():
        if m.pool == pool.name:
            machines[states[m.name]] = machines.get(states[m.name], 0) + 1
    return PoolOut(
        **pool_to_json(pool),
        fixed=pool.fixed,
        backoff_until=loop.backoff.get(pool.name),
        machines=machines,
        cost_per_hour_now=loop.spend.rate.get(pool.name, 0.0),
        spent_last_hour=loop.spend.last_hour.get(pool.name, 0.0),
    )
