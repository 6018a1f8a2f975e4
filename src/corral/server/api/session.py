"""``/v1/session``: the dashboard's login, a cookie instead of a token in the page's storage.

The dashboard sends the token once (``POST /v1/session``). The answer sets it
as a cookie that no script can read (HttpOnly: a script injected into the page
cannot steal it), that no other site's page sends (SameSite=Strict), that only
the API sees (Path=/v1: not the drop-in APIs, not the static files), and that
travels only over TLS when the server is reached over TLS (Secure). Requests
authenticated by the cookie alone that change something must also send
``X-Corral-CSRF`` (``deps.session_token``). The cookie holds the token itself,
so revoking the token ends the session too.

Every other client keeps sending ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from corral.server.api.deps import ERRORS, SESSION_COOKIE, Caller, Plane, require_csrf_header
from corral.server.api.schemas import ApiModel
from corral.server.services.auth import Principal

router = APIRouter(prefix="/v1/session", tags=["session"], responses=ERRORS)
COOKIE_PATH = "/v1"


class SessionIn(ApiModel):
    token: str = Field(min_length=1, max_length=512, description="an admin or team token")


class SessionOut(BaseModel):
    kind: str = Field(description="admin or team")
    name: str
    team: str | None


@router.post("", response_model=SessionOut)
async def log_in(body: SessionIn, request: Request, plane: Plane) -> JSONResponse:
    """Check the token and set it as the session cookie (the dashboard's login).

    Send the header ``X-Corral-CSRF: 1`` too. Agent tokens are refused (403).
    """
    require_csrf_header(request)
    who = await plane.auth.authenticate(body.token)
    who.require_client()
    response = JSONResponse(_out(who).model_dump())
    response.set_cookie(
        SESSION_COOKIE,
        body.token,
        max_age=int(plane.rt.settings.api.session_s),
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.get("", response_model=SessionOut)
async def whoami(who: Caller) -> SessionOut:
    """Who the session cookie (or the Bearer token) belongs to; 401 when logged out."""
    who.require_client()
    return _out(who)


@router.delete("", status_code=204, response_class=Response)
async def log_out(request: Request) -> Response:
    """Drop the session cookie (send ``X-Corral-CSRF: 1``). The token itself stays valid."""
    require_csrf_header(request)
    response = Response(status_code=204)
    response.delete_cookie(
        SESSION_COOKIE,
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


def _out(who: Principal) -> SessionOut:
    return SessionOut(kind=who.kind.value, name=who.name, team=who.team)
