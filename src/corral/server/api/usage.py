"""``/v1/usage``: GPU-seconds, CPU-seconds, jobs and cost, grouped as asked (docs/server.md).

The admin sees every team; a team token its own team alone. Times are whole
UTC hours: ``from`` and ``to`` are rounded out to the hours around them.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from corral.core.errors import InvalidSpec
from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.services import usage
from corral.server.store.usage_hours import Spent

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=ERRORS)

TIME_HELP = "epoch seconds or ISO 8601 (2026-11-29, 2026-11-29T08:00Z; no zone: UTC)"


class UsageRow(BaseModel):
    team: str | None = None
    user: str | None = None
    priority_class: str | None = Field(None, alias="class")
    pool: str | None = None
    day: str | None = Field(None, description="YYYY-MM-DD (UTC)")
    hour: str | None = Field(None, description="YYYY-MM-DDTHH:00Z")
    gpu_seconds: float
    milli_gpu_seconds: float = Field(description="GPU-seconds x 1000: a shared card's share")
    cpu_seconds: float
    jobs: int = Field(description="job attempts that ended (a retry counts again)")
    cost: float


class UsageOut(BaseModel):
    by: list[str]
    start: float = Field(alias="from")
    end: float = Field(alias="to")
    rows: list[UsageRow]
    total: UsageRow
    truncated: bool = Field(description=f"more than {usage.MAX_GROUPS} groups: the first ones")


@router.get(
    "", response_model=UsageOut, response_model_by_alias=True, response_model_exclude_none=True
)
async def get_usage(
    plane: Plane,
    who: Caller,
    by: Annotated[
        str, Query(max_length=64, description="comma-separated: team, user, class, pool, day, hour")
    ] = "team",
    start: Annotated[str | None, Query(alias="from", max_length=40, description=TIME_HELP)] = None,
    end: Annotated[str | None, Query(alias="to", max_length=40, description=TIME_HELP)] = None,
) -> dict[str, Any]:
    """Resources used per group over a time range (default: the last 30 days)."""
    groups = [b.strip() for b in by.split(",") if b.strip()]
    got = await usage.report(plane.rt, who, groups, _time(start, "from"), _time(end, "to"))
    total = Spent()
    rows = []
    for keys, spent in got.rows:
        total += spent
        rows.append({**_named(got.by, keys), **_figures(spent)})
    return {
        "by": list(got.by),
        "from": got.start,
        "to": got.end,
        "rows": rows,
        "total": _figures(total),
        "truncated": got.truncated,
    }


def _time(text: str | None, field: str) -> float | None:
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidSpec(field, f"not a time: {text!r} ({TIME_HELP})") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _named(by: tuple[str, ...], keys: tuple[object, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in zip(by, keys, strict=True):
        if name == "day":
            out[name] = dt.datetime.fromtimestamp(int(str(key)) * 86400, dt.UTC).date().isoformat()
        elif name == "hour":
            at = dt.datetime.fromtimestamp(int(str(key)) * 3600, dt.UTC)
            out[name] = at.strftime("%Y-%m-%dT%H:00Z")
        else:
            out[name] = key
    return out


def _figures(spent: Spent) -> dict[str, Any]:
    return {
        "gpu_seconds": spent.gpu_milli_s / 1000,
        "milli_gpu_seconds": spent.gpu_milli_s,
        "cpu_seconds": spent.cpu_s,
        "jobs": spent.jobs,
        "cost": round(spent.cost, 6),
    }
