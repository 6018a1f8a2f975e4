"""Auth and error shapes shared by the drop-in APIs (AUTOMATIC1111, ComfyUI).

Those tools send credentials their own way: A1111 clients started against
``--api-auth user:pass`` send HTTP Basic, other tools a Bearer token, and
browser websockets cannot set headers at all (``?token=``). Any of them with a
corral token as the secret is accepted; the Basic user name becomes the
corral user. Errors are answered in each tool's own shape, so the tool shows
corral's reason where it would show its backend's.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, HTTPConnection

from corral.core.errors import Forbidden, Unauthenticated
from corral.server.api.deps import admit
from corral.server.services.compat import Caller, caller_for

Render = Callable[[Exception], Response | None]


def credentials(header: str | None, query_token: str | None) -> tuple[str | None, str | None]:
    """(secret, Basic user name) from an Authorization header, else from ``?token=``."""
    scheme, _, value = (header or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value, None
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except ValueError:  # not base64 (non-ASCII text included), or not UTF-8 inside
            return None, None
        user, sep, password = decoded.partition(":")
        return (password or None, user or None) if sep else (None, None)
    return (query_token or None), None


async def compat_caller(conn: HTTPConnection) -> Caller:
    """The caller of a drop-in API request or websocket; ``Unauthenticated`` if none."""
    secret, user = credentials(conn.headers.get("authorization"), conn.query_params.get("token"))
    if secret is None:
        raise Unauthenticated(
            "send a corral token: HTTP Basic (any user name, the token as password) "
            "or 'Authorization: Bearer <token>'"
        )
    if (conn.headers.get("authorization") or "").strip().lower().startswith("basic"):
        same_origin(conn)
    principal = await admit(conn.app.state.plane, conn, secret)  # as the corral API admits
    principal.require_client()
    return caller_for(principal, user)


def same_origin(conn: HTTPConnection) -> None:
    """Refuse a browser's cross-site request carrying HTTP Basic credentials.

    A browser that logged in with Basic (ComfyUI's frontend at ``/comfyui/``) sends
    those credentials with any request to this host, including one a page of
    another site makes; its ``Origin`` then names that site. ComfyUI refuses such
    requests the same way (its ``origin_only_middleware``, for loopback hosts);
    corral faces the internet, so it refuses them for every host. Requests without
    ``Origin`` (scripts, tools) and Bearer tokens (never sent by a browser on its
    own) are not concerned.
    """
    origin = conn.headers.get("origin")
    if origin is None:
        return
    host = (conn.headers.get("host") or "").lower()
    if urlsplit(origin).netloc.lower() != host:
        raise Forbidden(f"a request from {origin} may not use this site's credentials")


def shaped_route(render: Render) -> type[APIRoute]:
    """A route class whose errors are answered by ``render`` (None: the app's handlers)."""

    class ShapedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def shaped(request: Request) -> Response:
                try:
                    return await handler(request)
                except ClientDisconnect:
                    raise  # the client left: the app's handler ends it without a traceback
                except Exception as exc:
                    response = render(exc)
                    if response is None:
                        raise
                    return response

            return shaped

    return ShapedRoute
