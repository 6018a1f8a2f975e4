"""Routes whose arguments are gathered by hand: the hot path without dependency solving.

FastAPI builds two things from an endpoint's signature: its OpenAPI entry and
its request handler, which solves the declared dependencies on every request.
For ``POST /v1/jobs`` that solving (the plane, the bearer scheme, the caller,
the header, the body) cost more than the submission itself: about 330 us of a
request's 500 us of server CPU in process (``bench/e2e.py``).

A route made with ``gathered_by(gather)`` keeps the declared endpoint: it is
still the route's one implementation and its OpenAPI entry. Only the handler
changes: ``gather(request)`` returns the endpoint's keyword arguments, raising
the same errors the declared dependencies would (a missing token is a 401
before anything is parsed; header and body errors are one 422 that names
every field), and the endpoint is awaited with them.

``HotRoutes`` then serves such routes before routing: FastAPI's router walks
its included routers and wraps each call in exit stacks (about 6% of the
server's CPU per job in the end-to-end benchmark). A request whose method
and path are exactly a hot route's goes straight to its handler, inside
Starlette's own ``ExceptionMiddleware`` with the app's exception handlers,
so errors come out as they would through the router. Everything else, and
anything outside this middleware (body limits, the 500 handler), is as
before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.server.api.deps import admit, get_plane, session_token
from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal

Gather = Callable[[Request], Awaitable[dict[str, Any]]]
Model = TypeVar("Model", bound=BaseModel)
JSON_TYPES = ("application/json",)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class Gathered(APIRoute):
    """A route served by ``handler``: its endpoint called with what ``gather`` returns."""

    gather: Gather

    def get_route_handler(self) -> Handler:
        endpoint, gather = self.endpoint, self.gather

        async def handle(request: Request) -> Response:
            response: Response = await endpoint(**await gather(request))
            return response

        return handle


def gathered_by(gather: Gather) -> type[APIRoute]:
    """A route class whose handler calls the endpoint with what ``gather`` returns."""
    return type("Gathered", (Gathered,), {"gather": staticmethod(gather)})


class HotRoutes:
    """ASGI middleware: requests for a ``Gathered`` route go to its handler, not the router."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self._hot = {
            (method, r.path): r.get_route_handler()
            for r in routes
            if isinstance(r, Gathered)
            for method in r.methods or ()
        }
        self._served: dict[tuple[str, str], ASGIApp] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = (scope.get("method", ""), scope["path"]) if scope["type"] == "http" else None
        handler = self._hot.get(key) if key is not None else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        served = self._served.get(key)  # type: ignore[arg-type]
        if served is None:  # the app's handlers are final once it serves requests
            served = self._served[key] = _with_handlers(scope["app"], handler)  # type: ignore[index]
        await served(scope, receive, send)


def _with_handlers(app: Any, handler: Handler) -> ASGIApp:
    """``handler`` as an ASGI app whose exceptions meet ``app``'s handlers, as routed ones do."""

    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        response = await handler(Request(scope, receive, send))
        await response(scope, receive, send)

    # What Starlette gives its own ExceptionMiddleware (500s stay with the outermost layer).
    handlers = {k: v for k, v in app.exception_handlers.items() if k not in (500, Exception)}
    return ExceptionMiddleware(respond, handlers=handlers, debug=app.debug)


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as ``HTTPBearer`` reads it."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def caller(request: Request) -> tuple[ControlPlane, Principal]:
    """The plane and the caller, as ``deps.get_principal`` gives it (its request charged)."""
    plane = await get_plane(request)
    return plane, await admit(plane, request, bearer_token(request) or session_token(request))


def header(
    request: Request, name: str, adapter: TypeAdapter[Any], errors: list[dict[str, Any]]
) -> Any:
    """The header's value checked by ``adapter`` (None when absent); its errors go to ``errors``."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        errors += [{**e, "loc": ("header", name.lower(), *e["loc"])} for e in exc.errors()]
        return None


async def json_body(
    request: Request, model: type[Model], errors: list[dict[str, Any]]
) -> Model | None:
    """The body parsed as ``model`` straight from its bytes; its errors go to ``errors``."""
    body = await request.body()
    if not body:
        errors.append({"type": "missing", "loc": ("body",), "msg": "Field required"})
        return None
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media not in JSON_TYPES and not media.endswith("+json"):
        errors.append(
            {
                "type": "content_type",
                "loc": ("body",),
                "msg": f"send JSON with 'Content-Type: application/json' (got {media or 'none'!r})",
            }
        )
        return None
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors += [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        return None


def refuse(errors: list[dict[str, Any]]) -> None:
    """Raise the one 422 for every error gathered, if there is any."""
    if errors:
        raise RequestValidationError(errors)
