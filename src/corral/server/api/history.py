"""``/v1/history``: the last hour of the cluster for the dashboard's plots (services/history.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.services.history import WINDOW_S, History

router = APIRouter(prefix="/v1/history", tags=["history"], responses=ERRORS)


def install(app: FastAPI, history: History) -> None:
    app.state.history = history
    app.include_router(router)


@router.get("")
async def history(
    request: Request,
    plane: Plane,
    who: Caller,
    seconds: Annotated[float, Query(gt=0, le=WINDOW_S, description="how far back")] = WINDOW_S,
    node: Annotated[str | None, Query(max_length=128, description="its cards only")] = None,
) -> dict[str, Any]:
    """Samples oldest first: ``queued`` per priority class and ``waited`` (seconds the
    longest-waiting job of each has waited), ``quota``, ``held`` and ``borrowed`` GPUs per
    team, ``idle_gpus``, ``ended`` (jobs that ended since the sample before) and, with
    ``node``, that node's ``cards`` (utilisation, temperature, VRAM used, reserved and
    total). A team token sees its own team's GPUs only."""
    who.require_client()
    kept: History = request.app.state.history
    team = None if who.is_admin else who.team
    start = plane.rt.clock.now() - seconds
    samples = [
        {
            "at": s.at,
            "queued": s.queued,
            "waited": s.waited,
            "quota": _only(s.quota, team),
            "held": _only(s.held, team),
            "borrowed": _only(s.borrowed, team),
            "idle_gpus": s.idle_gpus,
            "ended": s.ended,
            **({"cards": s.cards.get(node, [])} if node is not None else {}),
        }
        for s in kept.since(start)
    ]
    return {"sample_s": kept.period, "samples": samples}


def _only(by_team: dict[str, float], team: str | None) -> dict[str, float]:
    return by_team if team is None else {t: v for t, v in by_team.items() if t == team}
