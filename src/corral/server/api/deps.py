"""Dependencies every router uses: the control plane and the caller's principal (from a
Bearer token, or from the dashboard's session cookie)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from corral.core.errors import Forbidden
from corral.server.api.schemas import ErrorOut
from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal

SESSION_COOKIE = "corral_session"
CSRF_HEADER = "X-Corral-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_bearer = HTTPBearer(
    auto_error=False,
    description="An admin, team or agent token: `Authorization: Bearer <token>`",
)
FORWARDED_MAX = 255  # the audit log keeps this much of an X-Forwarded-For header


async def get_plane(request: Request) -> ControlPlane:
    """Async on purpose: FastAPI runs plain ``def`` dependencies in a thread pool."""
    plane: ControlPlane = request.app.state.plane
    return plane


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The holder of the Bearer token, else of the dashboard's session cookie; a team
    token's request counts toward its rate limit (``RateLimits``: 429 past it)."""
    plane: ControlPlane = request.app.state.plane
    secret = credentials.credentials if credentials else session_token(request)
    return await admit(plane, request, secret)


async def admit(plane: ControlPlane, conn: HTTPConnection, secret: str | None) -> Principal:
    """The holder of ``secret``, as every entry point admits a caller (the API, its hot
    routes, the drop-in APIs): authenticated, its request charged to its token's rate
    limit (``RateLimits``: 429 past it), and marked with where it came from (the audit
    log's address)."""
    who = await plane.auth.authenticate(secret)
    plane.rates.request(who)
    return who.at(*origin(conn))


def origin(conn: HTTPConnection) -> tuple[str | None, str | None]:
    """Where a request came from, for the audit log: the client's address, and the
    X-Forwarded-For header as sent (unverified: anyone can send one).

    The address is the connection's peer, or, when the peer is a proxy uvicorn
    trusts (``FORWARDED_ALLOW_IPS``, by default loopback only), the client that
    proxy names in X-Forwarded-For.
    """
    client = conn.client
    forwarded = ", ".join(conn.headers.getlist("x-forwarded-for"))
    return (client.host if client else None), (forwarded[:FORWARDED_MAX] or None)


def session_token(request: Request) -> str | None:
    """The token in the dashboard's session cookie (``api/session.py``), if there is one.

    A request that may change something must also carry ``X-Corral-CSRF``: the cookie is
    SameSite=Strict, and this header, which no cross-site form or plain cross-origin fetch
    can send, guards the browsers that ignore that.
    """
    token = request.cookies.get(SESSION_COOKIE)
    if token is not None and request.method not in SAFE_METHODS:
        require_csrf_header(request)
    return token


def require_csrf_header(request: Request) -> None:
    if CSRF_HEADER not in request.headers:
        raise Forbidden(
            f"send the header '{CSRF_HEADER}: 1' with a request that changes something "
            "and is authenticated by the dashboard's session cookie (cross-site protection)"
        )


Plane = Annotated[ControlPlane, Depends(get_plane)]
Caller = Annotated[Principal, Depends(get_principal)]

ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorOut, "description": "missing, unknown or revoked token"},
    403: {"model": ErrorOut, "description": "the token may not do this"},
    404: {"model": ErrorOut, "description": "no such thing (or not visible to this token)"},
    422: {"model": ErrorOut, "description": "a field is invalid (the message names it)"},
}
