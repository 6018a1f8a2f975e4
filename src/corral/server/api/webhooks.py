"""``/v1/webhooks/secret`` (a team's signing secret) and the deliveries of a job's,
pipeline's or array's webhook (``/v1/{jobs,pipelines,arrays}/{id}/deliveries``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.edits import DeliveriesOut, SecretOut, delivery_out

router = APIRouter(prefix="/v1", tags=["webhooks"], responses=ERRORS)
TeamQuery = Annotated[str | None, Query(max_length=64, description="admin: whose; default own")]


@router.get("/webhooks/secret", response_model=SecretOut)
async def secret(plane: Plane, who: Caller, team: TeamQuery = None) -> SecretOut:
    """The team's webhook signing secret (made on first use). Receivers check each call's
    ``Corral-Signature`` with it (docs/server.md, "Webhooks")."""
    value = await plane.webhooks.secret(who, team)
    return SecretOut(team=team or who.team or "default", secret=value)


@router.post("/webhooks/secret/rotate", response_model=SecretOut)
async def rotate(plane: Plane, who: Caller, team: TeamQuery = None) -> SecretOut:
    """A new secret for the team; calls signed from now on use it."""
    value = await plane.webhooks.secret(who, team, rotate=True)
    return SecretOut(team=team or who.team or "default", secret=value)


@router.get("/jobs/{job_id}/deliveries", response_model=DeliveriesOut)
async def deliveries(
    job_id: str, plane: Plane, who: Caller, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> DeliveriesOut:
    """The job's webhook deliveries, in event order, each with its attempts."""
    rows = await plane.webhooks.deliveries(who, job_id, limit)
    return DeliveriesOut(deliveries=[delivery_out(r) for r in rows])


@router.get("/pipelines/{group_id}/deliveries", response_model=DeliveriesOut)
@router.get("/arrays/{group_id}/deliveries", response_model=DeliveriesOut)
async def group_deliveries(
    group_id: str, plane: Plane, who: Caller, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> DeliveriesOut:
    """The deliveries of the pipeline's or array's own webhook (its end; with ``events:
    all`` its jobs' changes), in event order, each with its attempts."""
    rows = await plane.webhooks.group_deliveries(who, group_id, limit)
    return DeliveriesOut(deliveries=[delivery_out(r) for r in rows])
