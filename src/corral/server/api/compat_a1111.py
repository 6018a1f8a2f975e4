"""``/sdapi/v1/*``: the AUTOMATIC1111 webui API, served by the whole cluster.

Thin: the work is in ``services/compat_a1111.py``. Errors come in the webui's
shapes: its exception middleware's ``{"error", "detail", "body", "errors"}``,
and FastAPI's ``{"detail": [...]}`` for a malformed body.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from corral.core.errors import (
    AuthError,
    Conflict,
    Forbidden,
    InvalidSpec,
    LimitReached,
    NotFound,
    Unavailable,
)
from corral.server.api.compat_auth import compat_caller, shaped_route
from corral.server.api.errors import retry_after
from corral.server.services.compat import Caller, Unservable
from corral.server.services.compat_a1111 import A1111Service, GenerationFailed

log = logging.getLogger("corral.server.compat")


def error(status: int, name: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    """The webui's error body (``modules/api/api.py``, its exception handler)."""
    body = {"error": name, "detail": detail, "body": "", "errors": f"{status}: {detail}"}
    return JSONResponse(body, status_code=status, headers=headers)


def render(exc: Exception) -> Response | None:
    """Any failure of an ``/sdapi/v1`` route, in the webui's shape."""
    if isinstance(exc, LimitReached):
        return error(429, "HTTPException", str(exc), retry_after(exc))
    if isinstance(exc, AuthError):
        status = 403 if isinstance(exc, Forbidden) else 401
        detail = f"Incorrect username or password ({exc})" if status == 401 else str(exc)
        return error(status, "HTTPException", detail, {"WWW-Authenticate": "Basic"})
    if isinstance(exc, Unservable):
        return error(exc.status, "HTTPException", str(exc))
    if isinstance(exc, GenerationFailed):
        body = {"error": "RuntimeError", "detail": "", "body": "", "errors": str(exc)}
        return JSONResponse(body, status_code=500)
    if isinstance(exc, RequestValidationError):
        return JSONResponse({"detail": list(exc.errors())}, status_code=422)
    if isinstance(exc, InvalidSpec):
        problem = {"type": "value_error", "loc": ["body", exc.field], "msg": exc.message}
        return JSONResponse({"detail": [problem]}, status_code=422)
    for kind, status in ((NotFound, 404), (Conflict, 409), (Unavailable, 503)):
        if isinstance(exc, kind):
            return error(status, "HTTPException", str(exc))
    log.exception("sdapi: unexpected error", exc_info=exc)
    return error(500, type(exc).__name__, "internal error (see the corral server log)")


router = APIRouter(
    prefix="/sdapi/v1",
    tags=["AUTOMATIC1111-compatible"],
    route_class=shaped_route(render),
    include_in_schema=False,  # the webui's API, documented by the webui (docs/compat.md)
)
Who = Annotated[Caller, Depends(compat_caller)]
Json = Annotated[dict[str, Any], Body()]
Priority = Annotated[str | None, Header(alias="X-Corral-Priority", max_length=64)]


def service(request: Request) -> A1111Service:
    svc: A1111Service = request.app.state.compat.a1111
    return svc


async def _generate(
    request: Request, who: Caller, mode: str, body: dict[str, Any], priority: str | None
) -> Response:
    answer, rec = await service(request).generate(
        who, mode, body, priority=priority, disconnected=request.is_disconnected
    )
    headers = {"X-Corral-Job": rec.job.id, "X-Corral-Node": rec.node or ""}
    return JSONResponse(answer, headers=headers)


@router.post("/txt2img")
async def txt2img(request: Request, who: Who, body: Json, priority: Priority = None) -> Response:
    """Text to image as a corral job; answers when it ends: ``images``, ``parameters``, ``info``."""
    return await _generate(request, who, "txt2img", body, priority)


@router.post("/img2img")
async def img2img(request: Request, who: Who, body: Json, priority: Priority = None) -> Response:
    """Image to image (``init_images``: base64), as a corral job."""
    images = body.get("init_images")
    if not isinstance(images, list) or not images:
        return error(404, "HTTPException", "Init image not found")
    return await _generate(request, who, "img2img", body, priority)


@router.post("/extra-single-image")
async def extra_single_image(
    request: Request, who: Who, body: Json, priority: Priority = None
) -> Response:
    """Upscale one image (``image``: base64), as a corral job."""
    if not isinstance(body.get("image"), str) or not body["image"]:
        raise InvalidSpec("image", "Field required")
    return await _generate(request, who, "upscale", body, priority)


@router.get("/progress")
async def progress(
    request: Request,
    who: Who,
    skip_current_image: Annotated[bool, Query()] = False,
) -> dict[str, Any]:
    """Progress and live preview of the caller's own running request."""
    return await service(request).progress(who, skip_current_image)


@router.post("/interrupt")
async def interrupt(request: Request, who: Who) -> dict[str, Any]:
    """Stop the caller's running requests; they answer with what was made so far."""
    await service(request).interrupt(who)
    return {}


@router.post("/skip")
async def skip(request: Request, who: Who) -> dict[str, Any]:
    """Skip the caller's image being made (its request answers with it as it is)."""
    await service(request).skip(who)
    return {}


@router.get("/options")
async def get_options(request: Request, who: Who) -> dict[str, Any]:
    """The backend's options, with this caller's own choices on top."""
    return await service(request).options(who)


@router.post("/options", response_model=None)
async def set_options(request: Request, who: Who) -> Response | None:
    """Set options for this caller only (``sd_model_checkpoint``: its later requests' model).

    The body may be at most ``compat.options_max_bytes``: read no further than that."""
    svc = service(request)
    cap = svc.jobs.settings.options_max_bytes
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > cap:
            detail = f"options body over the limit of {cap} bytes (compat.options_max_bytes)"
            return error(413, "HTTPException", detail)
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidSpec("body", "not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidSpec("body", "must be a JSON object of option: value")
    await svc.set_options(who, body)
    return None


@router.get("/sd-models")
async def sd_models(request: Request, who: Who) -> list[Any]:
    """Every checkpoint the connected webui backends have."""
    return await service(request).listing(who, "sd-models")


@router.get("/loras")
async def loras(request: Request, who: Who) -> list[Any]:
    return await service(request).listing(who, "loras")


@router.get("/samplers")
async def samplers(request: Request, who: Who) -> list[Any]:
    return await service(request).listing(who, "samplers")


@router.get("/upscalers")
async def upscalers(request: Request, who: Who) -> list[Any]:
    return await service(request).listing(who, "upscalers")
