"""``/v1/inputs``: upload files for jobs to read, look one up, delete one (docs/server.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import BaseModel, Field

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.schemas import ErrorOut
from corral.server.services.inputs import StoredInput

router = APIRouter(prefix="/v1/inputs", tags=["inputs"], responses=ERRORS)


class InputFileOut(BaseModel):
    blob: str = Field(description="its sha256: what a job's inputs name")
    size: int
    name: str = Field(description="the name it was first uploaded under")
    mime: str
    created_at: float


@router.post(
    "",
    status_code=201,
    response_model=InputFileOut,
    responses={403: {"model": ErrorOut}, 413: {"model": ErrorOut}},
    openapi_extra={"requestBody": {"content": {"application/octet-stream": {}}, "required": True}},
)
async def upload(
    request: Request,
    plane: Plane,
    who: Caller,
    name: Annotated[str, Query(min_length=1, max_length=255, description="its file name")],
    content_type: Annotated[str | None, Header()] = None,
) -> InputFileOut:
    """The request body, streamed, as an input file of the caller's team; its ``blob`` id
    (sha256) goes in a job's ``inputs``. The same bytes again are the same file (201 both
    times). Over ``inputs.max_bytes`` is 413; a team at its caps gets 403."""
    stored = await plane.inputs.receive(who, request.stream(), name, content_type or "")
    return _out(stored)


@router.get("/{blob}", response_model=InputFileOut)
async def get(blob: str, plane: Plane, who: Caller) -> InputFileOut:
    """One of the caller's team's input files (404 for any other)."""
    return _out(await plane.inputs.get(who, blob))


@router.delete("/{blob}", status_code=204, response_class=Response)
async def delete(blob: str, plane: Plane, who: Caller) -> Response:
    """Forget the file; its bytes go once no team holds them."""
    await plane.inputs.delete(who, blob)
    return Response(status_code=204)


def _out(s: StoredInput) -> InputFileOut:
    return InputFileOut(**s.to_json())
