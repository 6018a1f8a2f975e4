"""``/v1/models``: the model registry (register, list, upload, download, remove).

Paths take the registry name as is, slashes included (``/v1/models/org/sdxl``);
``.../upload`` and ``.../file`` are the registry's own endpoints, so no model
name may end in them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Header, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

from corral.server.agentlink.grpc_link import GrpcLink
from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.schemas import ApiModel, ErrorOut
from corral.server.api.served_files import file_headers
from corral.server.plane import ControlPlane
from corral.server.services.models import Registration, UploadStatus, file_url
from corral.server.store import nodes as node_repo
from corral.server.store.models import ModelEntry

router = APIRouter(prefix="/v1/models", tags=["models"], responses=ERRORS)

Source = Annotated[str, Field(min_length=1, max_length=2048)]


class ModelIn(ApiModel):
    """A registry entry. ``size``/``sha256`` may be left out only for a file on the server."""

    sources: list[Source] = Field(
        min_length=1,
        max_length=16,
        description="tried in order: http(s) URLs, a file on the server "
        "(file:///path or /path), or 'upload' (then PUT the bytes to .../upload)",
        examples=[["https://example.com/sdxl-base.safetensors"], ["upload"]],
    )
    size: int | str | None = Field(None, description="exact bytes, or '6.5GiB'", examples=[1234])
    sha256: str | None = Field(None, max_length=64, description="64 hex digits")
    kind: str = Field("checkpoint", max_length=16, examples=["checkpoint", "lora", "vae"])
    backend: str = Field(
        "", max_length=64, description="the backend it is for (a1111, comfyui, ...); '' any"
    )


class SiteOut(BaseModel):
    node: str
    state: str = Field(description="loaded | on_disk | downloading | failed")
    progress: float | None = None
    node_state: str
    error: str = ""


class ModelOut(BaseModel):
    name: str
    kind: str
    backend: str
    size: int
    sha256: str
    sources: list[str]
    state: str = Field(description="ready | uploading")
    uploaded: int | None = Field(None, description="bytes of the upload the server has")
    file_url: str | None = Field(None, description="where the server serves its copy")
    created_at: float
    updated_at: float
    cached: list[SiteOut] = Field(description="nodes that hold it (loaded, on disk, downloading)")


class UploadOut(BaseModel):
    name: str
    size: int
    received: int
    complete: bool
    chunk_bytes: int = Field(description="send at most this many bytes per request")


def install(app: FastAPI, plane: ControlPlane) -> None:
    """Serve the registry, and let the agent link use it (refs, reports, file location)."""
    app.include_router(router)
    link = plane.link
    if isinstance(link, GrpcLink):
        settings = plane.rt.settings
        link.model_refs = plane.models.catalog.ref
        link.on_models = plane.model_status.report
        link.api_url = (settings.models.public_url or "").rstrip("/")
        link.api_port = settings.api.port


@router.get("", response_model=list[ModelOut])
async def list_models(plane: Plane, who: Caller) -> list[ModelOut]:
    """Every registered model, with where it is cached."""
    return await _views(plane, await plane.models.listing(who))


@router.get(
    "/{name:path}/upload",
    response_model=UploadOut,
    responses={409: {"model": ErrorOut}},
)
async def upload_status(name: str, plane: Plane, who: Caller) -> UploadOut:
    """How much of the upload arrived: resume by sending from ``received`` on (admin)."""
    return _upload_out(await plane.models.upload_status(who, name))


@router.put(
    "/{name:path}/upload",
    response_model=UploadOut,
    responses={409: {"model": ErrorOut}},
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {}}, "required": True}},
)
async def upload_chunk(
    name: str,
    request: Request,
    plane: Plane,
    who: Caller,
    content_range: Annotated[str | None, Header()] = None,
) -> UploadOut:
    """One chunk of the model's bytes, ``Content-Range: bytes first-last/size`` (admin).

    Chunks may be retried; a gap is 409 with where to go on from. The last
    chunk completes the upload: its sha256 is checked, a mismatch discards it.
    """
    data = await request.body()
    return _upload_out(await plane.models.upload(who, name, content_range, data))


@router.get(
    "/{name:path}/file",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, 409: {"model": ErrorOut}},
)
async def model_file(name: str, plane: Plane, who: Caller) -> Response:
    """The model's bytes (HTTP Range supported): what agents download. Any token."""
    path, entry = await plane.models.file(name)
    headers = {"ETag": f'"{entry.sha256}"', "X-Corral-Sha256": entry.sha256}
    headers |= file_headers(name, "application/octet-stream")
    return FileResponse(path, media_type="application/octet-stream", headers=headers)


@router.get("/{name:path}", response_model=ModelOut)
async def get_model(name: str, plane: Plane, who: Caller) -> ModelOut:
    """One model, with where it is cached."""
    return (await _views(plane, [await plane.models.get(who, name)]))[0]


@router.put("/{name:path}", response_model=ModelOut, status_code=200)
async def put_model(name: str, body: ModelIn, plane: Plane, who: Caller) -> JSONResponse:
    """Register a model, or replace its entry (admin). 201 when new, 200 when replaced."""
    reg = Registration(tuple(body.sources), body.size, body.sha256, body.kind, body.backend)
    entry, created = await plane.models.put(who, name, reg)
    out = (await _views(plane, [entry]))[0]
    return JSONResponse(out.model_dump(mode="json"), status_code=201 if created else 200)


@router.delete("/{name:path}", status_code=204, response_class=Response)
async def delete_model(name: str, plane: Plane, who: Caller) -> Response:
    """Remove a model from the registry (admin). Agents' copies age out of their caches."""
    await plane.models.delete(who, name)
    return Response(status_code=204)


async def _views(plane: ControlPlane, entries: list[ModelEntry]) -> list[ModelOut]:
    async with plane.rt.db.read() as conn:
        nodes = [r.node for r in await node_repo.all_nodes(conn)]
    return [
        ModelOut(
            name=e.name,
            kind=e.kind,
            backend=e.backend,
            size=e.size,
            sha256=e.sha256,
            sources=list(e.sources),
            state=e.state,
            uploaded=plane.models.received(e),
            file_url=file_url(e.name) if e.server_file else None,
            created_at=e.created_at,
            updated_at=e.updated_at,
            cached=[
                SiteOut(
                    node=s.node,
                    state=s.state,
                    progress=s.progress,
                    node_state=s.node_state,
                    error=s.error,
                )
                for s in plane.model_status.sites(e.name, nodes)
            ],
        )
        for e in entries
    ]


def _upload_out(s: UploadStatus) -> UploadOut:
    return UploadOut(
        name=s.name,
        size=s.size,
        received=s.received,
        complete=s.complete,
        chunk_bytes=s.chunk_bytes,
    )
