"""ComfyUI's ``/upload/image`` and ``/upload/mask`` on the cluster, and the uploaded
images a ``/prompt`` names.

An upload is stored as an input file of the caller's team (``services/inputs.py``:
streamed, capped, stored once per content), and its name is kept the way ComfyUI's
``server.py`` (``image_upload``) keeps files in its folders: per folder (``type``
input, temp or output, and ``subfolder``), a name already taken becomes ``name
(1).png``, ``name (2).png``... unless the same bytes are under it already (that
name is answered again) or ``overwrite`` is ``true``/``1``; the answer is ComfyUI's
``{"name", "subfolder", "type"}``. A subfolder leaving its folder is ComfyUI's bare
400. ``/upload/mask`` saves the original picture (``original_ref``, one of the
team's uploads) with the mask's alpha channel, as ComfyUI does; when the original
is not among them nothing is saved and the name is still answered, as ComfyUI
answers it.

A ``/prompt`` whose ``LoadImage``/``LoadImageMask`` names an uploaded image
(``photo.png``, ``sub/photo.png``, ``photo.png [temp]``: ComfyUI's annotated
names) becomes a job with that file among its inputs; the agent uploads it to the
backend that runs the job under a name of its own and points the graph there.
Names are the team's: every token of a team sees the same folders, as every
client of one ComfyUI sees its input folder.
"""

from __future__ import annotations

import asyncio
import io
import json
import mimetypes
import posixpath
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import sqlalchemy as sa

from corral.core.comfyui import SELF_VALIDATED
from corral.core.errors import NotFound
from corral.core.model import InputFile
from corral.server.services.auth import Principal
from corral.server.services.inputs import InputService, blob_key, owner_of
from corral.server.services.unit import Runtime
from corral.server.store.tables import input_names, inputs

TYPES = ("input", "temp", "output")
ANNOTATIONS = {" [input]": "input", " [output]": "output", " [temp]": "temp"}
READ_BYTES = 1 << 20


class BadUpload(Exception):
    """ComfyUI answers this upload with a bare 400."""


@dataclass(frozen=True, slots=True)
class Upload:
    """One ``/upload/image`` form: the file (spooled by the form parser) and its fields."""

    file: IO[bytes]
    filename: str
    mime: str
    kind: str
    subfolder: str
    overwrite: bool
    original_ref: str | None = None  # ``/upload/mask``


class ComfyUploads:
    def __init__(self, rt: Runtime, inputs: InputService) -> None:
        self.rt = rt
        self.inputs = inputs

    async def upload(self, who: Principal, up: Upload) -> dict[str, str]:
        """Store the file; ComfyUI's answer ``{name, subfolder, type}``."""
        folder = _folder(up.kind, up.subfolder)
        if up.original_ref is not None:
            masked = await self._masked(who, up)
            if masked is None:  # no such original: nothing saved, the name answered
                return {"name": up.filename, "subfolder": up.subfolder, "type": up.kind}
            source: AsyncIterator[bytes] = _once(masked)
        else:
            source = _chunks(up.file)
        stored = await self.inputs.receive(who, source, up.filename, up.mime)
        name = await self._name(owner_of(who), folder, up.filename, stored.sha256, up.overwrite)
        return {"name": name, "subfolder": up.subfolder, "type": up.kind}

    async def _name(self, owner: str, folder: str, wanted: str, sha: str, overwrite: bool) -> str:
        """The name the file gets in ``folder`` (ComfyUI's collision rule), recorded."""
        stem, ext = posixpath.splitext(wanted)
        async with self.rt.tx() as tx:
            query = sa.select(input_names.c.name, input_names.c.sha256).where(
                input_names.c.owner == owner, input_names.c.folder == folder
            )
            taken = {row.name: row.sha256 for row in await tx.conn.execute(query)}
            name, n = wanted, 1
            while name in taken and not overwrite:
                if taken[name] == sha:
                    return name
                name, n = f"{stem} ({n}){ext}", n + 1
            key = (input_names.c.owner == owner) & (input_names.c.folder == folder)
            await tx.conn.execute(sa.delete(input_names).where(key, input_names.c.name == name))
            await tx.conn.execute(
                sa.insert(input_names).values(
                    owner=owner, folder=folder, name=name, sha256=sha, created_at=tx.now
                )
            )
        return name

    async def resolve(self, who: Principal, prompt: Mapping[str, Any]) -> dict[str, str]:
        """``{image name as the graph writes it: sha256}`` for every uploaded image a
        ``LoadImage``/``LoadImageMask`` of ``prompt`` names (unknown names are left out)."""
        wanted: dict[str, tuple[str, str]] = {}
        for node in prompt.values():
            if not isinstance(node, dict) or node.get("class_type") not in SELF_VALIDATED:
                continue
            image = (node.get("inputs") or {}).get("image")
            if isinstance(image, str) and (place := locate(image)) is not None:
                wanted[image] = place
        if not wanted:
            return {}
        owner = owner_of(who)
        async with self.rt.db.read() as conn:
            query = sa.select(input_names).where(
                input_names.c.owner == owner,
                input_names.c.folder.in_(sorted({f for f, _ in wanted.values()})),
            )
            known = {(r.folder, r.name): r.sha256 for r in await conn.execute(query)}
        return {image: known[place] for image, place in wanted.items() if place in known}

    async def view(
        self, who: Principal, filename: str, subfolder: str, kind: str
    ) -> tuple[bytes, str]:
        """An uploaded file's bytes and type (``/view?type=input``); NotFound for a name the
        team was not given."""
        try:
            folder = _folder(kind, subfolder)
        except BadUpload:
            raise NotFound(f"{filename} not found") from None
        async with self.rt.db.read() as conn:
            query = (
                sa.select(input_names.c.sha256, inputs.c.mime)
                .join(
                    inputs,
                    (inputs.c.owner == input_names.c.owner)
                    & (inputs.c.sha256 == input_names.c.sha256),
                )
                .where(
                    input_names.c.owner == owner_of(who),
                    input_names.c.folder == folder,
                    input_names.c.name == filename,
                )
            )
            row = (await conn.execute(query)).first()
        if row is None:
            raise NotFound(f"{filename} not found")
        guessed = mimetypes.guess_type(filename)[0]
        return await self.rt.blobs.get(blob_key(row.sha256)), guessed or row.mime

    async def input_names(self, who: Principal) -> list[str]:
        """The team's files directly in its input folder: ``LoadImage``'s choices."""
        async with self.rt.db.read() as conn:
            query = sa.select(input_names.c.name).where(
                input_names.c.owner == owner_of(who), input_names.c.folder == "input/"
            )
            return sorted(row.name for row in await conn.execute(query))

    async def _masked(self, who: Principal, up: Upload) -> bytes | None:
        """The original (an upload of the team) with the mask's alpha, as PNG bytes."""
        try:
            ref = json.loads(up.original_ref or "{}")
        except ValueError:
            return None
        if not isinstance(ref, dict) or not isinstance(ref.get("filename"), str):
            return None
        name, kind = _annotation(str(ref["filename"]))
        try:
            folder = _folder(
                kind or str(ref.get("type") or "output"), str(ref.get("subfolder") or "")
            )
        except BadUpload:
            return None
        async with self.rt.db.read() as conn:
            query = sa.select(input_names.c.sha256).where(
                input_names.c.owner == owner_of(who),
                input_names.c.folder == folder,
                input_names.c.name == name,
            )
            sha = (await conn.execute(query)).scalar()
        if sha is None:
            return None
        original = await self.rt.blobs.get(blob_key(sha))
        mask = await asyncio.to_thread(up.file.read)
        return await asyncio.to_thread(_with_alpha, original, mask)


def locate(image: str) -> tuple[str, str] | None:
    """(folder, name) of an image as ComfyUI's ``LoadImage`` reads it: an annotation picks
    the type (default input), a ``sub/`` part the subfolder."""
    name, kind = _annotation(image)
    subfolder, _, base = name.rpartition("/")
    try:
        return _folder(kind or "input", subfolder), base
    except BadUpload:
        return None


def _annotation(name: str) -> tuple[str, str | None]:
    for suffix, kind in ANNOTATIONS.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], kind
    return name, None


def _folder(kind: str, subfolder: str) -> str:
    """``<type>/<subfolder>``, the subfolder normalised; one leaving its folder (or an
    unknown type) is ComfyUI's 400."""
    if kind not in TYPES:
        raise BadUpload(f"unknown upload type {kind!r}")
    normal = posixpath.normpath(subfolder.replace("\\", "/")) if subfolder else "."
    if normal.startswith(("/", "..")):
        raise BadUpload("the subfolder leaves the upload folder")
    return f"{kind}/{'' if normal == '.' else normal}"


async def _chunks(file: IO[bytes]) -> AsyncIterator[bytes]:
    while piece := await asyncio.to_thread(file.read, READ_BYTES):
        yield piece


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _with_alpha(original: bytes, mask: bytes) -> bytes:
    """ComfyUI's ``upload_mask``: the original as RGBA, its alpha the mask's, kept text
    chunks, PNG at compression level 4."""
    from PIL import Image  # imported when a mask is uploaded: the server needs it only then
    from PIL.PngImagePlugin import PngInfo

    with Image.open(io.BytesIO(original)) as opened:
        info = PngInfo()
        for key, value in getattr(opened, "text", {}).items():
            info.add_text(key, value)
        picture = opened.convert("RGBA")
    with Image.open(io.BytesIO(mask)) as alpha:
        picture.putalpha(alpha.convert("RGBA").getchannel("A"))
    out = io.BytesIO()
    picture.save(out, format="PNG", compress_level=4, pnginfo=info)
    return out.getvalue()


def job_inputs(files: Mapping[str, str], graph: Mapping[str, Any]) -> tuple[InputFile, ...]:
    """The uploaded images the graph (as it will run) still names."""
    used = {
        (node.get("inputs") or {}).get("image")
        for node in graph.values()
        if isinstance(node, dict) and node.get("class_type") in SELF_VALIDATED
    }
    return tuple(InputFile(name, sha) for name, sha in files.items() if name in used)


def backend_images(info: Mapping[str, Any]) -> frozenset[str]:
    """The files a backend's ``LoadImage`` lists: its own input folder."""
    spec = ((info.get("LoadImage") or {}).get("input") or {}).get("required", {}).get("image")
    if isinstance(spec, list) and spec and isinstance(spec[0], list):
        return frozenset(str(name) for name in spec[0])
    return frozenset()


def with_choices(info: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """``/object_info`` with ``LoadImage``'s (and ``LoadImageMask``'s) image choices the
    caller's uploads and the files the backend has, as a ComfyUI lists the files of its
    input folder there."""
    out = dict(info)
    for kind in SELF_VALIDATED:
        node = out.get(kind)
        if not isinstance(node, dict):
            continue
        spec = (node.get("input") or {}).get("required", {}).get("image")
        if not isinstance(spec, list) or not spec or not isinstance(spec[0], list):
            continue
        choices = sorted({*names, *(str(n) for n in spec[0])})  # and the backend's own
        required = {**node["input"]["required"], "image": [choices, *spec[1:]]}
        out[kind] = {**node, "input": {**node["input"], "required": required}}
    return out
