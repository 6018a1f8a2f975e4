"""Input files: upload a file once, name it in jobs (docs/sdk.md, "Input files").

::

    photo = corral.upload_input("photo.png")           # POST /v1/inputs
    corral.submit(backend="comfyui", payload={"workflow": graph}, inputs=[photo.ref()])
    corral.submit(backend="comfyui", payload={"workflow": graph}, files=["photo.png"])

A file's ``blob`` is its sha256: the same bytes uploaded again are the same file.
Only the team that uploaded a file may name it in a job.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from corral.sdk.calls import Call, _model
from corral.sdk.models import _Out

FileSource = str | Path | bytes
Files = Iterable[str | Path] | Mapping[str, FileSource]


class InputRef(BaseModel):
    """One entry of a job's ``inputs``: an uploaded file and what the payload calls it."""

    blob: str = Field(description="the file's sha256, from upload_input")
    name: str = Field(description="the name the payload uses (a LoadImage's image, ...)")


class InputFile(_Out):
    """An uploaded input file."""

    blob: str
    size: int
    name: str
    mime: str
    created_at: float

    def ref(self, name: str | None = None) -> dict[str, str]:
        """This file as a job input, called ``name`` (default: the name it was first
        uploaded under: the same bytes uploaded again keep it)."""
        return {"blob": self.blob, "name": name or self.name}


def upload(data: bytes, name: str, mime: str | None = None) -> Call[InputFile]:
    kind = mime or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Call(
        "POST",
        "/v1/inputs",
        _model(InputFile),
        params=[("name", name)],
        content=data,
        headers={"Content-Type": kind},
    )


def get(blob: str) -> Call[InputFile]:
    return Call("GET", f"/v1/inputs/{blob}", _model(InputFile))


def delete(blob: str) -> Call[Any]:
    return Call("DELETE", f"/v1/inputs/{blob}", lambda _: None)


def read(files: Files) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of each file: paths are named by their file name, a mapping's
    keys name its values (a path, or bytes)."""
    if isinstance(files, Mapping):
        items = list(files.items())
    else:
        items = [(Path(f).name, f) for f in files]
    return [
        (name, src if isinstance(src, bytes) else Path(src).read_bytes()) for name, src in items
    ]
