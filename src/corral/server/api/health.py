"""``/healthz`` and ``/metrics`` (no token needed: load balancers and Prometheus scrape them)."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from corral.server.api.deps import Plane

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(plane: Plane, response: Response) -> dict[str, str]:
    """200 ``{"status": "ok"}`` when the store answers; 503 otherwise."""
    try:
        async with plane.rt.db.read() as conn:
            await conn.execute(sa.text("SELECT 1"))
    except Exception as exc:  # any store failure means "not healthy", never a 500
        response.status_code = 503
        return {"status": "unavailable", "store": type(exc).__name__}
    return {"status": "ok"}


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(plane: Plane) -> Response:
    """Prometheus text format: queue depth, placements, preemptions, latencies, nodes."""
    return Response(plane.rt.metrics.render(), media_type=CONTENT_TYPE_LATEST)
