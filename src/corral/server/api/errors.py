"""One error shape for every failure: ``{"error", "message", "field"?, "fields"?}``.

corral's exception tree maps to status codes here, and FastAPI's validation
errors are rewritten so the message names the field in the caller's terms
(``resources.gpus``, ``jobs[3].priority``, ``limit``, ``Idempotency-Key``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from corral.core.errors import (
    AuthError,
    Conflict,
    CorralError,
    Forbidden,
    InvalidSpec,
    LimitReached,
    NotFound,
    QuotaExceeded,
    TooLarge,
    Unauthenticated,
    Unavailable,
)

log = logging.getLogger("corral.server.api")

_STATUS: tuple[tuple[type[CorralError], int, str], ...] = (
    (InvalidSpec, 422, "invalid"),
    (NotFound, 404, "not_found"),
    (Conflict, 409, "conflict"),
    (Unauthenticated, 401, "unauthenticated"),
    (QuotaExceeded, 403, "quota_exceeded"),
    (Forbidden, 403, "forbidden"),
    (LimitReached, 429, "too_many_requests"),
    (TooLarge, 413, "too_large"),
    (AuthError, 401, "unauthenticated"),
    (Unavailable, 503, "unavailable"),
)
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 400: "bad_request"}


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    body = {"error": code, "message": message} | {k: v for k, v in extra.items() if v is not None}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def retry_after(exc: LimitReached) -> dict[str, str]:
    """The ``Retry-After`` header for a refusal: whole seconds, at least one."""
    return {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}


Refused = Callable[[Request, Forbidden], Awaitable[None]]
"""Told of every request refused for lack of rights (the audit log records them)."""


def install(app: FastAPI, *, refused: Refused | None = None) -> None:
    """Register the handlers on ``app``; ``refused`` hears of every 403 before it is sent."""

    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> JSONResponse:
        if refused is not None and isinstance(exc, Forbidden):
            await refused(request, exc)
        for kind, status, code in _STATUS:
            if isinstance(exc, kind):
                field = exc.field if isinstance(exc, InvalidSpec) else None
                message = exc.message if isinstance(exc, InvalidSpec) else str(exc)
                if field:
                    message = f"{field}: {message}"
                response = error_response(status, code, message, field=field)
                if isinstance(exc, LimitReached):
                    response.headers.update(retry_after(exc))
                return response
        log.error("unexpected corral error: %r", exc)
        return error_response(500, "internal", "internal error (see the server log)")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [_field_error(e) for e in exc.errors()]
        message = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
        first = fields[0]["field"] if fields else None
        return error_response(422, "invalid", message, field=first, fields=fields)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client left (or was cut off for sending too slowly) while its body was read:
        # no one reads this answer, and it is no server error worth a traceback.
        return error_response(400, "disconnected", "the client left before its body arrived")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal", "internal error (see the server log)")


def _field_error(error: Any) -> dict[str, str]:
    loc: Sequence[Any] = error.get("loc", ())
    where = loc[0] if loc else "body"
    path = _dotted(loc[1:])
    if where == "header":
        path = "-".join(p.capitalize() for p in str(path).split("-")) + " header"
    if error.get("type") == "json_invalid":
        return {
            "field": "body",
            "message": f"not valid JSON ({error.get('ctx', {}).get('error', '')})",
        }
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return {"field": path or str(where), "message": message}


def _dotted(parts: Sequence[Any]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out
