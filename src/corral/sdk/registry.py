"""The model registry through the API: typed answers, calls, and a resumable upload.

``Client.add_model(name, file="sdxl.safetensors")`` registers a local file
and uploads it in chunks (``PUT /v1/models/{name}/upload`` with
``Content-Range``). An upload that is cut off (a dropped connection, a
killed process) resumes: the client asks the server how much arrived and
sends the rest, so calling ``add_model`` again continues where it stopped.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from corral.sdk.calls import Call, _model
from corral.sdk.errors import ClientError
from corral.sdk.models import _Out

if TYPE_CHECKING:
    from corral.sdk.client import Client

UPLOAD = "upload"
HASH_BLOCK = 1024 * 1024


class ModelSite(_Out):
    """One node's copy of a model."""

    node: str
    state: str  # loaded | on_disk | downloading | failed
    progress: float | None = None
    node_state: str = "ready"
    error: str = ""


class ModelInfo(_Out):
    name: str
    kind: str = "checkpoint"
    backend: str = ""
    size: int = 0
    sha256: str = ""
    sources: list[str] = Field(default_factory=list)
    state: str = "ready"  # ready | uploading
    uploaded: int | None = None
    file_url: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    cached: list[ModelSite] = Field(default_factory=list)


class UploadInfo(_Out):
    name: str
    size: int
    received: int
    complete: bool
    chunk_bytes: int


@dataclass(frozen=True, slots=True)
class UploadProgress:
    """Where an upload is: ``phase`` is ``hashing`` or ``uploading``."""

    name: str
    phase: str
    done: int
    total: int


Progress = Callable[[UploadProgress], None]


def _path(name: str) -> str:
    # Registry names may contain "/": the API takes them as they are.
    return f"/v1/models/{name}"


def list_models() -> Call[list[ModelInfo]]:
    return Call("GET", "/v1/models", _model(list[ModelInfo]))


def get_model(name: str) -> Call[ModelInfo]:
    return Call("GET", _path(name), _model(ModelInfo))


def put_model(name: str, body: dict[str, Any]) -> Call[ModelInfo]:
    return Call("PUT", _path(name), _model(ModelInfo), json=body)


def upload_status(name: str) -> Call[UploadInfo]:
    return Call("GET", _path(name) + "/upload", _model(UploadInfo))


def registration(
    sources: Sequence[str],
    size: int | str | None,
    sha256: str | None,
    kind: str,
    backend: str,
) -> dict[str, Any]:
    body: dict[str, Any] = {"sources": list(sources), "kind": kind, "backend": backend}
    if size is not None:
        body["size"] = size
    if sha256 is not None:
        body["sha256"] = sha256
    return body


def file_sha256(path: Path, progress: Progress | None = None, name: str = "") -> str:
    """The sha256 of a local file, reporting progress while it reads."""
    total = path.stat().st_size
    digest, done = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
            done += len(block)
            if progress is not None:
                progress(UploadProgress(name, "hashing", done, total))
    return digest.hexdigest()


def add_local_file(
    client: Client,
    name: str,
    file: str | os.PathLike[str],
    *,
    sources: Sequence[str] = (),
    sha256: str | None = None,
    kind: str = "checkpoint",
    backend: str = "",
    progress: Progress | None = None,
) -> ModelInfo:
    """Register ``file`` under ``name`` (with ``sources`` as other places to fetch it from)
    and upload it, resuming an upload of the same bytes that was cut off."""
    path = Path(file).expanduser()
    if not path.is_file():
        raise ClientError(f"{path}: no such file")
    size = path.stat().st_size
    sha = sha256 or file_sha256(path, progress, name)
    body = registration([*sources, UPLOAD], size, sha, kind, backend)
    info = client.run(put_model(name, body))
    if info.state != "ready":
        upload_file(client, name, path, progress)
        info = client.run(get_model(name))
    return info


def upload_file(client: Client, name: str, path: Path, progress: Progress | None = None) -> None:
    """Send ``path``'s bytes from where the server's copy stops, a chunk per request."""
    status = client.run(upload_status(name))
    with path.open("rb") as f:
        while not status.complete:
            f.seek(status.received)
            data = f.read(status.chunk_bytes)
            if not data:
                raise ClientError(
                    f"{path} is shorter ({status.received} bytes) than model {name} "
                    f"({status.size} bytes): was it changed while uploading?"
                )
            last = status.received + len(data) - 1
            response = client.request(
                "PUT",
                _path(name) + "/upload",
                content=data,
                headers={
                    "Content-Range": f"bytes {status.received}-{last}/{status.size}",
                    "Content-Type": "application/octet-stream",
                },
            )
            status = UploadInfo.model_validate(response.json())
            if progress is not None:
                progress(UploadProgress(name, "uploading", status.received, status.size))
