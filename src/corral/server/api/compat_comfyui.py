"""The ComfyUI API (``/prompt``, ``/history/{id}``, ``/view``, ``/queue``, ``/interrupt``,
``/ws``), served by the whole cluster; the rest is in ``compat_comfyui_cluster.py``.

The websocket follows the caller's event stream (so it works on any replica)
and sends, for the prompts this ``clientId`` queued, the JSON messages and
binary preview frames ComfyUI itself sends (``services/compat_comfyui_events.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile
from starlette.websockets import WebSocketDisconnect

from corral.core.comfyui import OUTPUTS_MANIFEST
from corral.core.comfyui import error as comfy_error
from corral.core.errors import AuthError, CorralError, Forbidden, LimitReached, NotFound, TooLarge
from corral.core.events import Event
from corral.server.api.compat_auth import compat_caller, shaped_route
from corral.server.api.errors import retry_after
from corral.server.api.schemas import has_nul
from corral.server.api.served_files import file_headers
from corral.server.services.compat import Caller, Unservable
from corral.server.services.compat_comfyui import BACKEND, ComfyService, PromptRejected
from corral.server.services.compat_comfyui_events import (
    PreviewRef,
    PromptWatch,
    preview_frame,
    status_message,
    translate,
)
from corral.server.services.compat_comfyui_images import reencode
from corral.server.services.compat_comfyui_uploads import BadUpload, Upload
from corral.server.services.feed import one_by_one
from corral.server.store import jobs as job_repo

log = logging.getLogger("corral.server.compat")
VIEW_TYPES = ("output", "input", "temp")  # ComfyUI's folder types
MAX_WATCHED = 10_000
"""Jobs a ComfyUI websocket remembers (whether each is one of its prompts): far more than
run at once, so only jobs long over are forgotten (looked up again if seen again)."""


def render(exc: Exception) -> Response | None:
    """Any failure of a ComfyUI route, as ComfyUI's ``{"error": {...}, "node_errors": {}}``."""
    if isinstance(exc, PromptRejected):
        return JSONResponse(exc.body, status_code=400)
    status, kind, headers = 500, "internal", None
    if isinstance(exc, LimitReached):
        status, kind, headers = 429, "too_many_requests", retry_after(exc)
    elif isinstance(exc, AuthError):
        status, kind = (403, "forbidden") if isinstance(exc, Forbidden) else (401, "unauthorized")
    elif isinstance(exc, Unservable):
        status, kind = exc.status, "unavailable"
    elif isinstance(exc, NotFound):
        status, kind = 404, "not_found"
    elif isinstance(exc, TooLarge):
        status, kind = 413, "too_large"
    elif isinstance(exc, RequestValidationError):
        status, kind = 400, "invalid_prompt"
    elif isinstance(exc, CorralError):
        status, kind = 400, "invalid"
    else:
        log.exception("comfyui api: unexpected error", exc_info=exc)
    message = "internal error (see the corral server log)" if status == 500 else str(exc)
    if status == 401:
        headers = {"WWW-Authenticate": "Basic"}
    body = {"error": comfy_error(kind, message), "node_errors": {}}
    return JSONResponse(body, status_code=status, headers=headers)


router = APIRouter(
    tags=["ComfyUI-compatible"],
    route_class=shaped_route(render),
    include_in_schema=False,  # ComfyUI's API, documented by ComfyUI (docs/compat.md)
)
Who = Annotated[Caller, Depends(compat_caller)]
Priority = Annotated[str | None, Header(alias="X-Corral-Priority", max_length=64)]


def service(request: Request | WebSocket) -> ComfyService:
    svc: ComfyService = request.app.state.compat.comfyui
    return svc


async def json_body(request: Request) -> dict[str, Any]:
    """The body as JSON whatever its Content-Type (ComfyUI reads it so; its examples send none)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise PromptRejected(comfy_error("invalid_prompt", "the body is not JSON")) from None
    if not isinstance(body, dict):
        raise PromptRejected(comfy_error("invalid_prompt", "the body must be a JSON object"))
    if has_nul(body):  # as the corral API: PostgreSQL can neither store nor compare them
        raise PromptRejected(comfy_error("invalid_prompt", "the body must not contain NUL"))
    return body


@router.post("/prompt")
async def prompt(request: Request, who: Who, priority: Priority = None) -> dict[str, Any]:
    """Queue a workflow (API format) as a corral job; a chosen ``prompt_id`` is kept."""
    return await service(request).submit(who, await json_body(request), priority)


@router.post("/upload/image")
async def upload_image(request: Request, who: Who) -> Response:
    """Store an image for later prompts, answered as ComfyUI answers (docs/compat.md)."""
    return await _upload(request, who, mask=False)


@router.post("/upload/mask")
async def upload_mask(request: Request, who: Who) -> Response:
    """An uploaded original with this mask's alpha, as ComfyUI's mask editor saves it."""
    return await _upload(request, who, mask=True)


async def _upload(request: Request, who: Caller, *, mask: bool) -> Response:
    async with request.form(max_files=1, max_fields=16) as form:
        image = form.get("image")
        if not isinstance(image, UploadFile) or not image.filename:
            return Response(status_code=400)  # ComfyUI's bare 400
        up = Upload(
            file=image.file,
            filename=image.filename,
            mime=image.content_type or "application/octet-stream",
            kind=str(form.get("type") or "input"),
            subfolder=str(form.get("subfolder") or ""),
            overwrite=str(form.get("overwrite")) in ("true", "1"),
            original_ref=str(form.get("original_ref") or "{}") if mask else None,
        )
        try:
            answer = await service(request).uploads.upload(who.principal, up)
        except BadUpload:
            return Response(status_code=400)
    return JSONResponse(answer)


@router.get("/history/{prompt_id}")
async def history(request: Request, who: Who, prompt_id: str) -> dict[str, Any]:
    """A finished prompt's outputs and status (``{}`` while it waits or runs)."""
    return await service(request).history(who, prompt_id)


@router.get("/view")
async def view(
    request: Request,
    who: Who,
    filename: Annotated[str, Query(max_length=255)],
    subfolder: Annotated[str, Query(max_length=255)] = "",
    type: Annotated[str, Query(max_length=32)] = "output",  # ComfyUI's name
    preview: Annotated[str | None, Query(max_length=32)] = None,
    channel: Annotated[str | None, Query(max_length=8)] = None,
) -> Response:
    """An output image (``subfolder`` is the corral job that made it), or an uploaded one
    (``type`` input or temp: the team's uploads, as ComfyUI serves its folders);
    ``preview`` and ``channel`` re-encode an output as ComfyUI does. As ComfyUI: 400 for a
    file name with a leading ``/`` or ``..`` or an unknown ``type``, 404 for a file it
    does not have."""
    if filename.startswith("/") or ".." in filename or type not in VIEW_TYPES:
        return Response(status_code=400)
    if type in ("input", "temp"):
        data, content_type = await service(request).uploads.view(
            who.principal, filename, subfolder, type
        )
        return Response(data, media_type=content_type, headers=file_headers(filename, content_type))
    data, content_type = await service(request).view(who, filename, subfolder)
    converted = reencode(data, preview, channel)
    if converted is not None:
        data, content_type = converted
    return Response(data, media_type=content_type, headers=file_headers(filename, content_type))


@router.get("/queue")
async def queue(request: Request, who: Who) -> dict[str, Any]:
    """The caller's prompts running and waiting."""
    return await service(request).queue(who)


@router.post("/queue")
async def edit_queue(request: Request, who: Who) -> Response:
    """``{"delete": [prompt_id, ...]}`` drops waiting prompts of the caller's team;
    ``{"clear": true}`` all of them (ComfyUI: ``clear`` first, then ``delete``)."""
    body = await json_body(request)
    if body.get("clear"):
        await request.app.state.compat.comfyui_cluster.clear(who)
    await service(request).delete(who, [str(p) for p in body.get("delete") or []])
    return Response(status_code=200)


@router.post("/interrupt")
async def interrupt(request: Request, who: Who) -> Response:
    """Interrupt ``{"prompt_id": ...}``, or every running prompt of the caller."""
    prompt_id = (await json_body(request)).get("prompt_id")
    await service(request).interrupt(who, str(prompt_id) if prompt_id else None)
    return Response(status_code=200)


@router.websocket("/ws")
async def websocket(
    ws: WebSocket, client_id: Annotated[str | None, Query(alias="clientId")] = None
) -> None:
    """Progress, previews and outcomes of this client's prompts, as ComfyUI sends them."""
    try:
        who = await compat_caller(ws)
    except CorralError as exc:
        await ws.send_denial_response(render(exc) or Response(status_code=401))
        return
    try:
        slot = ws.app.state.plane.streams.admit(who.principal)  # the stream caps hold here too
    except LimitReached as exc:
        await ws.send_denial_response(render(exc) or Response(status_code=429))
        return
    try:
        await ws.accept()
        sid = client_id or uuid.uuid4().hex
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await _stream(ws, who, sid)
    finally:
        slot.release()


async def _stream(ws: WebSocket, who: Caller, sid: str) -> None:
    """Follow the caller's events from now on; send what concerns ``sid``'s prompts."""
    plane = ws.app.state.plane
    after = await plane.feed.head()
    await ws.send_json(status_message(0, sid))
    watches: dict[str, PromptWatch | None] = {}
    closed = asyncio.Event()
    reader = asyncio.create_task(_read_until_closed(ws, closed))

    async def gone() -> bool:
        return closed.is_set()

    follow = plane.feed.follow(who.principal, after, disconnected=gone)
    events = plane.auth.sessions.until_revoked(who.principal.token_id, follow)
    try:
        await _relay(ws, who, sid, one_by_one(events), watches)
    finally:
        reader.cancel()


async def _read_until_closed(ws: WebSocket, closed: asyncio.Event) -> None:
    """Read (and ignore) what the client sends, to notice when it leaves."""
    try:
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass
    finally:
        closed.set()


async def _relay(
    ws: WebSocket,
    who: Caller,
    sid: str,
    events: AsyncIterator[Event | None],
    watches: dict[str, PromptWatch | None],
) -> None:
    plane = ws.app.state.plane
    async for event in events:
        if event is None or event.job_id is None:
            continue
        watch = await _watch(plane, watches, event.job_id, sid)
        if watch is None:
            continue
        if OUTPUTS_MANIFEST in (event.data.get("files") or ()):
            watch.manifest = await service(ws).manifest(who, event.job_id)
        for message in translate(event, watch):
            await _send(ws, who, watch, message)
        if watch.ended:
            watches[event.job_id] = None
            pending = sum(1 for w in watches.values() if w is not None)
            await ws.send_json(status_message(pending))


async def _watch(
    plane: Any, watches: dict[str, PromptWatch | None], job_id: str, sid: str
) -> PromptWatch | None:
    """The watch of a job if it is a prompt of client ``sid`` (looked up once per job, and
    remembered for the last ``MAX_WATCHED`` jobs seen: a socket open for days sees many)."""
    if job_id in watches:
        return watches[job_id]
    if len(watches) >= MAX_WATCHED:
        del watches[next(iter(watches))]  # the job seen longest ago
    async with plane.rt.db.read() as conn:
        rec = await job_repo.get(conn, job_id)
    watch = None
    payload = rec.job.payload if rec is not None else {}
    if rec is not None and rec.job.backend == BACKEND and payload.get("client_id") == sid:
        workflow = dict(payload.get("workflow") or {})
        watch = PromptWatch(job_id, str(payload.get("prompt_id")), workflow)
    watches[job_id] = watch
    return watch


async def _send(
    ws: WebSocket, who: Caller, watch: PromptWatch, message: dict[str, Any] | PreviewRef
) -> None:
    if not isinstance(message, PreviewRef):
        await ws.send_json(message)
        return
    plane = ws.app.state.plane
    key = message.url.rsplit("/", 1)[-1]
    try:
        image = await plane.jobs.preview(who.principal, watch.job_id, key)
    except CorralError:
        return  # gone from the blob store: a preview is not worth failing the socket
    await ws.send_bytes(preview_frame(image, message.content_type))
