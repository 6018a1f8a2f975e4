"""Routes whose arguments are gathered by hand: the hot path without dependency solving.

FastAPI builds two things from an endpoint's signature: its OpenAPI entry and
its request handler, which solves the declared dependencies on every request.
For ``POST /v1/jobs`` that solving (the plane, the bearer scheme, the caller,
the header, the body) cost more than the submission itself: about 330 us of a
request's 500 us of server CPU in process (docs/performance.md, "Fifth round").

A route made with ``gathered_by(gather)`` keeps the declared endpoint: it is
still the route's one implementation and its OpenAPI entry. Only the handler
changes: ``gather(request)`` returns the endpoint's keyword arguments, raising
the same errors the declared dependencies would (a missing token is a 401
before anything is parsed; header and body errors are one 422 that names
every field), and the endpoint is awaited with them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError

from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal

Gather = Callable[[Request], Awaitable[dict[str, Any]]]
Model = TypeVar("Model", bound=BaseModel)
JSON_TYPES = ("application/json",)


def gathered_by(gather: Gather) -> type[APIRoute]:
    """A route class whose handler calls the endpoint with what ``gather`` returns."""

    class Gathered(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            endpoint = self.endpoint

            async def handle(request: Request) -> Response:
                response: Response = await endpoint(**await gather(request))
                return response

            return handle

    return Gathered


def bearer_token(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as ``HTTPBearer`` reads it."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def caller(request: Request) -> tuple[ControlPlane, Principal]:
    plane: ControlPlane = request.app.state.plane
    return plane, await plane.auth.authenticate(bearer_token(request))


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
