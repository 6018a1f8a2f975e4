"""The rest of ComfyUI's API: what the cluster offers, its history, queue info, ``/free``.

Each route answers as the ComfyUI route of the same path does (its ``server.py``):
the same status codes and bodies, over every connected ComfyUI node
(``services/compat_comfyui_cluster.py``). Errors come in ComfyUI's shape, as
on the other ComfyUI routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from corral.core.comfyui import MODEL_FOLDERS
from corral.core.errors import InvalidSpec
from corral.server.api.compat_auth import compat_caller, shaped_route
from corral.server.api.compat_comfyui import json_body, render
from corral.server.services.compat import Caller
from corral.server.services.compat_comfyui_cluster import HISTORY_MAX, ComfyCluster
from corral.server.services.compat_comfyui_info import JOB_STATUSES, one_class

router = APIRouter(
    tags=["ComfyUI-compatible"], route_class=shaped_route(render), include_in_schema=False
)
Who = Annotated[Caller, Depends(compat_caller)]
Name = Annotated[str, Query(max_length=255)]


def cluster(request: Request) -> ComfyCluster:
    found: ComfyCluster = request.app.state.compat.comfyui_cluster
    return found


@router.get("/object_info")
async def object_info(request: Request, who: Who) -> dict[str, Any]:
    """Every node type any connected ComfyUI node has (ComfyUI: its ``NODE_CLASS_MAPPINGS``)."""
    return await cluster(request).offered(who)


@router.get("/object_info/{node_class}")
async def object_info_one(request: Request, who: Who, node_class: str) -> dict[str, Any]:
    """One node type, or ``{}`` when no node has it (ComfyUI answers 200 ``{}`` too)."""
    return one_class(await cluster(request).offered(who), node_class)


@router.get("/models")
async def model_folders(who: Who) -> list[str]:
    """ComfyUI's model folder names (its ``folder_names_and_paths`` keys)."""
    return list(MODEL_FOLDERS)


@router.get("/models/{folder}")
async def models(request: Request, who: Who, folder: str) -> Response:
    """A folder's files on any node; 404 with no body for an unknown folder, as ComfyUI."""
    if folder not in MODEL_FOLDERS:
        return Response(status_code=404)
    return JSONResponse(await cluster(request).models(who, folder))


@router.get("/embeddings")
async def embeddings(request: Request, who: Who) -> list[str]:
    """Embedding names without their extension, as ComfyUI lists them."""
    return await cluster(request).embeddings(who)


@router.get("/system_stats")
async def system_stats(request: Request, who: Who) -> dict[str, Any]:
    """The devices of every ComfyUI node (ComfyUI: its one torch device)."""
    return await cluster(request).system_stats(who)


@router.get("/history")
async def history(
    request: Request,
    who: Who,
    max_items: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
) -> dict[str, Any]:
    """The team's ended prompts by id, the last ``max_items`` (oldest first)."""
    return await cluster(request).history(who, max_items)


@router.get("/jobs")
async def jobs(
    request: Request,
    who: Who,
    status: Annotated[str, Query(max_length=200)] = ",".join(JOB_STATUSES),
    limit: Annotated[int, Query(ge=1, le=HISTORY_MAX)] = HISTORY_MAX,
    offset: Annotated[int, Query(ge=0, le=HISTORY_MAX)] = 0,
) -> dict[str, Any]:
    """ComfyUI's ``/jobs``: ``{"jobs": [...], "pagination": {...}}``; ``status`` is a comma
    list of ``pending``, ``in_progress``, ``completed``, ``failed``, ``cancelled``."""
    statuses = [s.strip() for s in status.split(",") if s.strip()]
    unknown = sorted(set(statuses) - set(JOB_STATUSES))
    if unknown:
        raise InvalidSpec("status", f"unknown {', '.join(unknown)}; use {', '.join(JOB_STATUSES)}")
    return await cluster(request).job_list(who, statuses, limit, offset)


@router.get("/prompt")
async def queue_info(request: Request, who: Who) -> dict[str, Any]:
    """``{"exec_info": {"queue_remaining": n}}``: the team's prompts running and waiting."""
    return await cluster(request).queue_info(who)


@router.post("/free")
async def free(request: Request, who: Who) -> Response:
    """Accepted and ignored: corral's agents decide what their backends keep loaded
    (ComfyUI sets flags to unload models after its current prompt)."""
    await json_body(request)
    return Response(status_code=200)
