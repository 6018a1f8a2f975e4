"""The reference ComfyUI's folders and uploads, as ComfyUI's ``server.py`` and
``folder_paths.py`` handle them.

* Three folders: ``input`` (uploads, what ``LoadImage`` lists), ``temp``
  (``PreviewImage``'s files; uploads may go there too) and ``output``.
* An image name is resolved as ``folder_paths.get_annotated_filepath`` does: a
  trailing `` [input]``, `` [output]`` or `` [temp]`` picks the folder, else it is
  the input folder; the name may hold a subfolder (``masks/a.png``).
* ``POST /upload/image`` (multipart: ``image``, ``type``, ``subfolder``,
  ``overwrite``) mirrors ``image_upload``: the file is saved in the folder of its
  ``type`` (default ``input``), in ``subfolder``; a name already taken becomes
  ``name (1).png``, ``name (2).png``..., unless the same bytes are already there
  under it (then nothing is written and that name is answered) or ``overwrite`` is
  ``true``/``1``; the answer is ``{"name", "subfolder", "type"}``. A subfolder
  leaving the folder, or no file, is a bare 400.
* ``POST /upload/mask`` also takes ``original_ref`` (``{"filename", "subfolder",
  "type"}``, type default ``output``): the saved file is the original picture with
  the uploaded mask's alpha channel as its own (PNG). When the original is not
  found nothing is saved, yet the name is answered, as ComfyUI does.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from PIL.PngImagePlugin import PngInfo
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

ANNOTATIONS = {" [input]": "input", " [output]": "output", " [temp]": "temp"}


@dataclass(frozen=True)
class Folders:
    input: Path
    temp: Path
    output: Path

    def by_type(self, kind: str | None) -> Path | None:
        return {"input": self.input, "temp": self.temp, "output": self.output}.get(kind or "input")

    def annotated(self, name: str) -> Path:
        """The file an image name means (``ValueError`` for one leaving its folder)."""
        base = self.input
        for suffix, kind in ANNOTATIONS.items():
            if name.endswith(suffix):
                name, base = name[: -len(suffix)], self.by_type(kind) or self.input
                break
        path = (base / name).resolve()
        if not name or base.resolve() not in path.parents:
            raise ValueError(f"Invalid image file: {name}")
        return path

    def exists(self, name: str) -> bool:
        """``folder_paths.exists_annotated_filepath``."""
        try:
            return self.annotated(name).is_file()
        except ValueError:
            return False

    def input_files(self) -> tuple[str, ...]:
        """``LoadImage``'s choices: the files directly in the input folder."""
        if not self.input.is_dir():
            return ()
        return tuple(sorted(p.name for p in self.input.iterdir() if p.is_file()))


async def upload(request: Request, folders: Folders, *, mask: bool = False) -> Response:
    """``/upload/image`` (``mask``: ``/upload/mask``)."""
    async with request.form() as form:
        return await _upload(form, folders, mask)


async def _upload(form: FormData, folders: Folders, mask: bool) -> Response:
    image = form.get("image")
    kind = str(form.get("type") or "input")
    folder = folders.by_type(kind)
    if not isinstance(image, UploadFile) or not image.filename or folder is None:
        return Response(status_code=400)
    subfolder = str(form.get("subfolder") or "")
    target = Path(os.path.abspath(os.path.join(folder, os.path.normpath(subfolder))))
    filename = image.filename
    path = Path(os.path.abspath(os.path.join(target, filename)))
    if os.path.commonpath((folder, path)) != str(folder):
        return Response(status_code=400)
    target.mkdir(parents=True, exist_ok=True)
    data = await image.read()
    if str(form.get("overwrite")) not in ("true", "1"):
        stem, ext = os.path.splitext(filename)
        n = 1
        while path.exists():
            if _same(path, data):  # the same bytes under that name: not written again
                return _answer(filename, subfolder, kind)
            filename = f"{stem} ({n}){ext}"
            path, n = target / filename, n + 1
    if not mask:
        path.write_bytes(data)
    else:
        _save_masked(folders, str(form.get("original_ref") or "{}"), data, path)
    return _answer(filename, subfolder, kind)


def _answer(name: str, subfolder: str, kind: str) -> Response:
    return JSONResponse({"name": name, "subfolder": subfolder, "type": kind})


def _same(path: Path, data: bytes) -> bool:
    return hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()


def _save_masked(folders: Folders, original_ref: str, data: bytes, path: Path) -> None:
    """The original picture with the mask's alpha, saved at ``path`` (nothing when the
    original is not there or its reference leaves its folder)."""
    ref: Any = json.loads(original_ref)
    name = str(ref.get("filename", "")) if isinstance(ref, dict) else ""
    if not name or name.startswith("/") or ".." in name:
        return
    base = None
    for suffix, kind in ANNOTATIONS.items():
        if name.endswith(suffix):
            name, base = name[: -len(suffix)], folders.by_type(kind)
            break
    base = base or folders.by_type(str(ref.get("type") or "output"))
    if base is None:
        return
    original = (base / str(ref.get("subfolder") or "") / name).resolve()
    if base.resolve() not in original.parents or not original.is_file():
        return
    with Image.open(original) as opened:
        metadata = PngInfo()
        for key, value in getattr(opened, "text", {}).items():
            metadata.add_text(key, value)
        picture = opened.convert("RGBA")
    with Image.open(io.BytesIO(data)) as uploaded:
        picture.putalpha(uploaded.convert("RGBA").getchannel("A"))
    picture.save(path, format="PNG", compress_level=4, pnginfo=metadata)
