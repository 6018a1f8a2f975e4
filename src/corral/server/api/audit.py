"""``/v1/audit``: the admin reads who did what, when and from where (docs/security/audit.md).

Read only: no route changes or deletes a record (the retention sweep alone does,
after ``retention.audit_s``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, StringConstraints

from corral.core.errors import CorralError, Forbidden, InvalidSpec
from corral.server.api.deps import ERRORS, Caller, Plane, origin
from corral.server.api.direct import bearer_token
from corral.server.api.errors import Refused
from corral.server.plane import ControlPlane
from corral.server.services.jobs import decode_cursor, encode_cursor
from corral.server.store.audit import AuditFilter, AuditRecord

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=ERRORS)

MAX_SEQ = 2**63 - 1  # record numbers are 64-bit
MAX_ACTIONS = 20  # action filters in one request
TEXT = r"^[^\x00]*$"  # no NUL: PostgreSQL cannot compare text holding one
ActionName = Annotated[str, StringConstraints(max_length=64, pattern=TEXT)]


class AuditQuery(BaseModel):
    """Which records to read; every filter given must match."""

    actor: str | None = Field(None, max_length=128, pattern=TEXT, description="token id or name")
    team: str | None = Field(None, max_length=64, pattern=TEXT, description="the actor's team")
    action: list[ActionName] = Field(
        default_factory=list,
        max_length=MAX_ACTIONS,
        description="repeat for several; job.* for every job action",
    )
    target: str | None = Field(None, max_length=255, pattern=TEXT, description="e.g. a job id")
    since: float | None = Field(None, allow_inf_nan=False, description="epoch s, at or after")
    until: float | None = Field(None, allow_inf_nan=False, description="epoch s, before")
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = Field(None, max_length=100, description="a next_cursor from before")


class ActorOut(BaseModel):
    id: str | None = Field(description="the token's id; null for the server itself")
    kind: str = Field(description="admin, team, agent, or server")
    name: str
    team: str | None


class AuditOut(BaseModel):
    seq: int
    at: float
    actor: ActorOut
    action: str = Field(description="e.g. token.create, team.set, job.cancel, auth.denied")
    target: str = Field(description="what it was done to: a token or job id, a name, a route")
    detail: dict[str, Any]
    address: str | None = Field(description="the client's address")
    forwarded_for: str | None = Field(description="the X-Forwarded-For header as sent")


class AuditPageOut(BaseModel):
    records: list[AuditOut]
    next_cursor: str | None = Field(
        description="pass as ?cursor= for the next (older) page; null at the end"
    )


@router.get("", response_model=AuditPageOut)
async def audit_log(plane: Plane, who: Caller, q: Annotated[AuditQuery, Query()]) -> AuditPageOut:
    """The audit log, newest first (admin). Follow ``next_cursor`` for older records."""
    where = AuditFilter(
        actor=q.actor,
        team=q.team,
        actions=tuple(q.action),
        target=q.target,
        since=q.since,
        until=q.until,
    )
    page = await plane.audit.page(who, where, _before(q.cursor), q.limit)
    return AuditPageOut(
        records=[_out(r) for r in page.records],
        next_cursor=encode_cursor(page.next_seq) if page.next_seq is not None else None,
    )


def _before(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    seq = decode_cursor(cursor)
    if not 0 < seq <= MAX_SEQ:
        raise InvalidSpec("cursor", "not a cursor returned by this API")
    return seq


def _out(r: AuditRecord) -> AuditOut:
    return AuditOut(
        seq=r.seq,
        at=r.at,
        actor=ActorOut(id=r.actor_id, kind=r.actor_kind, name=r.actor_name, team=r.actor_team),
        action=r.action,
        target=r.target,
        detail=r.detail,
        address=r.address,
        forwarded_for=r.forwarded_for,
    )


def refusals(plane: ControlPlane) -> Refused:
    """What records a request refused for lack of rights, with the token that sent it
    (``AuditService.denied`` keeps it to a few per token and minute)."""

    async def record(request: Request, exc: Forbidden) -> None:
        if request.scope["type"] != "http":  # a websocket's refusal is answered its own way
            return
        try:
            who = await plane.auth.authenticate(bearer_token(request))
        except CorralError:  # no token at all: nobody to record
            return
        target = f"{request.method} {request.url.path}"
        await plane.audit.denied(who.at(*origin(request)), target, str(exc))

    return record
