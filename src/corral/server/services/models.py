"""The model registry: names -> exact bytes (size, sha256), kind, backend, where to fetch.

A model is registered with ``PUT /v1/models/{name}`` and one or more
sources, tried by agents in the order given:

* ``https://...`` / ``http://...``: agents fetch it directly (Range, resume);
* a file on the server (``file:///srv/models/x.safetensors`` or an absolute
  path): the server serves it at ``/v1/models/{name}/file``;
* ``upload``: the bytes come through the API in chunks
  (``PUT /v1/models/{name}/upload`` with ``Content-Range``), resumable; the
  model is ``uploading`` until the last byte is in and its sha256 matches.

Every assignment whose job names a registered model carries its
``ModelRef`` (``catalog.ref``), so agents never guess sizes or hashes. The
catalog is an in-memory copy of the (small) registry table, updated at once
by changes made here and re-read every few seconds for other replicas'.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import Conflict, InvalidSpec, NotFound
from corral.core.resources import parse_bytes
from corral.server.agentlink.model_wire import ModelRef
from corral.server.modelfiles import ModelFiles, file_sha256
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.model_sources import SourcePolicy
from corral.server.services.unit import Runtime
from corral.server.store import models as model_repo
from corral.server.store.models import READY, UPLOAD, UPLOADING, ModelEntry

KINDS = ("checkpoint", "lora", "vae", "embedding", "controlnet", "upscaler", "other")
MAX_SOURCES = 16
CATALOG_REFRESH_S = 5.0
"""Changes made on another replica reach this one's assignments within this long."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@:/-]{0,199}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_RESERVED = ("upload", "file")  # last path segments that name the registry's own endpoints
_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


@dataclass(frozen=True, slots=True)
class Registration:
    """What ``PUT /v1/models/{name}`` asks for, before it is checked."""

    sources: tuple[str, ...]
    size: int | str | None = None
    sha256: str | None = None
    kind: str = "checkpoint"
    backend: str = ""


@dataclass(frozen=True, slots=True)
class UploadStatus:
    name: str
    size: int
    received: int
    complete: bool
    chunk_bytes: int  # send at most this much per request (the API's body limit)


def file_url(name: str) -> str:
    """Where the server serves a model's file, relative to the API."""
    return f"/v1/models/{name}/file"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidSpec("name", f"{name!r} is not a model name (letters, digits, ._+@:/-)")
    if name.rsplit("/", 1)[-1] in _RESERVED:
        raise InvalidSpec("name", f"a model name may not end in /{name.rsplit('/', 1)[-1]}")
    return name


class Catalog:
    """The registry in memory: refs for assignments, sizes for the scheduler."""

    def __init__(self) -> None:
        self.entries: dict[str, ModelEntry] = {}
        self.loaded_at: float | None = None

    def put(self, entry: ModelEntry) -> None:
        self.entries[entry.name] = entry

    def drop(self, name: str) -> None:
        self.entries.pop(name, None)

    async def refresh(self, conn: AsyncConnection, now: float, *, force: bool = False) -> None:
        if not force and self.loaded_at is not None and now - self.loaded_at < CATALOG_REFRESH_S:
            return
        self.entries = {e.name: e for e in await model_repo.all_models(conn)}
        self.loaded_at = now

    def ref(self, name: str) -> ModelRef | None:
        entry = self.entries.get(name)
        return None if entry is None else ref_of(entry)

    def sizes(self) -> dict[str, int]:
        return {name: e.size for name, e in self.entries.items()}


def ref_of(entry: ModelEntry) -> ModelRef:
    """The agent's view: URLs as registered, the server's own copy as a relative URL."""
    sources: list[str] = []
    for source in entry.sources:
        if source.startswith(("http://", "https://")):
            sources.append(source)
        elif file_url(entry.name) not in sources:
            sources.append(file_url(entry.name))
    return ModelRef(entry.name, entry.size, entry.sha256, tuple(sources), entry.kind, entry.backend)


class ModelService:
    """Register, list, upload, serve and remove models."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.files = ModelFiles(rt.settings.model_path())
        self.catalog = Catalog()
        self.sources = SourcePolicy.of(rt.settings)  # what may be published (model_sources.py)

    async def load(self) -> None:
        async with self.rt.db.read() as conn:
            await self.catalog.refresh(conn, self.rt.clock.now(), force=True)

    async def sizes(self, conn: AsyncConnection) -> dict[str, int]:
        """Registered models' sizes for a scheduling cycle (re-read every few seconds)."""
        await self.catalog.refresh(conn, self.rt.clock.now())
        return self.catalog.sizes()

    async def put(self, who: Principal, name: str, reg: Registration) -> tuple[ModelEntry, bool]:
        """Create or replace a registry entry; True when it is new."""
        who.require_admin("register models")
        entry = await self._checked(check_name(name), reg)
        async with self.rt.tx(reschedule=True) as tx:
            old = await model_repo.get(tx.conn, name)
            if old is None:
                await model_repo.insert(tx.conn, replace(entry, created_at=tx.now))
            elif not await model_repo.replace(tx.conn, old, entry):
                raise Conflict(f"model {name} changed meanwhile; retry")
            stored = await model_repo.get(tx.conn, name)
            await audit.record(tx, who, "model.put", name, _registered(entry, old))
        assert stored is not None
        self.catalog.put(stored)
        if old is not None and old.sha256 != entry.sha256:
            await self._forget_bytes(old)
        return stored, old is None

    async def get(self, who: Principal, name: str) -> ModelEntry:
        who.require_client()
        async with self.rt.db.read() as conn:
            entry = await model_repo.get(conn, name)
        if entry is None:
            raise NotFound(f"model {name} is not registered")
        return entry

    async def listing(self, who: Principal) -> list[ModelEntry]:
        who.require_client()
        async with self.rt.db.read() as conn:
            entries = await model_repo.all_models(conn)
        self.catalog.entries = {e.name: e for e in entries}
        return entries

    async def delete(self, who: Principal, name: str) -> None:
        """Remove the entry (and the server's uploaded copy, unless another name uses it)."""
        who.require_admin("remove models")
        async with self.rt.tx(reschedule=True) as tx:
            entry = await model_repo.get(tx.conn, name)
            if entry is None or not await model_repo.delete(tx.conn, name):
                raise NotFound(f"model {name} is not registered")
            await audit.record(tx, who, "model.delete", name, {"sha256": entry.sha256})
        self.catalog.drop(name)
        await self._forget_bytes(entry)

    async def upload_status(self, who: Principal, name: str) -> UploadStatus:
        who.require_admin("upload models")
        return self._status(await self._uploadable(name))

    async def upload(
        self, who: Principal, name: str, content_range: str | None, data: bytes
    ) -> UploadStatus:
        """Store one chunk; the last one completes the upload (sha256 checked)."""
        who.require_admin("upload models")
        entry = await self._uploadable(name)
        start = parse_content_range(content_range, entry.size, len(data))
        async with self.files.lock(entry.sha256):
            if not self.files.has(entry.sha256):
                received = await self.files.write(entry.sha256, entry.size, start, data)
                if received == entry.size:
                    await self.files.finish(entry.sha256)
            if self.files.has(entry.sha256) and not entry.ready:
                entry = await self._mark_ready(entry)
        return self._status(entry)

    async def file(self, name: str) -> tuple[Path, ModelEntry]:
        """The file the server serves for ``name`` (any token may fetch it, agents included)."""
        async with self.rt.db.read() as conn:
            entry = await model_repo.get(conn, name)
        if entry is None:
            raise NotFound(f"model {name} is not registered")
        if not entry.ready:
            received = self.files.received(entry.sha256)
            raise Conflict(
                f"model {name} is still uploading ({received} of {entry.size} bytes): "
                "it can be fetched once the upload is complete"
            )
        path = Path(entry.server_file) if entry.server_file else None
        if path is None or not path.is_file():
            raise NotFound(f"model {name} has no file on the server (fetch it from its URLs)")
        if UPLOAD not in entry.sources:  # a registered file: still where files may be served?
            self.sources.check_served(name, entry.server_file or "")
        return path, entry

    def received(self, entry: ModelEntry) -> int | None:
        """Bytes of its upload on the server (None: not an uploaded model)."""
        return self.files.received(entry.sha256) if UPLOAD in entry.sources else None

    # ---- helpers ---------------------------------------------------------------

    async def _checked(self, name: str, reg: Registration) -> ModelEntry:
        sources, server_file = check_sources(reg.sources)
        await self.sources.check(sources)
        size = parse_bytes(reg.size, field_name="size") if reg.size is not None else None
        sha = reg.sha256.lower() if reg.sha256 else None
        if sha is not None and not _SHA256.match(sha):
            raise InvalidSpec("sha256", f"must be 64 hex digits, got {reg.sha256!r}")
        if reg.kind not in KINDS:
            raise InvalidSpec("kind", f"unknown kind {reg.kind!r} (one of {', '.join(KINDS)})")
        if server_file is not None:
            field = f"sources[{sources.index(server_file)}]"
            size, sha = await _check_server_file(field, server_file, size, sha)
        if size is None or size <= 0:
            raise InvalidSpec("size", "the exact size in bytes is required (and must be > 0)")
        if sha is None:
            raise InvalidSpec("sha256", "is required unless the model is a file on the server")
        state = READY
        if UPLOAD in sources:
            server_file = str(self.files.file_path(sha)) if self.files.has(sha) else None
            state = READY if server_file else UPLOADING
        now = self.rt.clock.now()
        return ModelEntry(
            name, size, sha, sources, reg.kind, reg.backend, state, server_file, now, now
        )

    async def _uploadable(self, name: str) -> ModelEntry:
        async with self.rt.db.read() as conn:
            entry = await model_repo.get(conn, name)
        if entry is None:
            raise NotFound(f"model {name} is not registered")
        if UPLOAD not in entry.sources:
            raise Conflict(
                f"model {name} is not registered for upload: "
                'PUT /v1/models/{name} with "upload" among its sources first'
            )
        return entry

    def _status(self, entry: ModelEntry) -> UploadStatus:
        received = self.files.received(entry.sha256)
        chunk = self.rt.settings.api.max_body_bytes
        return UploadStatus(entry.name, entry.size, received, self.files.has(entry.sha256), chunk)

    async def _mark_ready(self, entry: ModelEntry) -> ModelEntry:
        """Every entry waiting for these bytes becomes ready."""
        path = str(self.files.file_path(entry.sha256))
        async with self.rt.tx(reschedule=True) as tx:
            for other in await model_repo.all_models(tx.conn):
                if other.sha256 == entry.sha256 and UPLOAD in other.sources and not other.ready:
                    done = replace(other, state=READY, server_file=path, updated_at=tx.now)
                    await model_repo.replace(tx.conn, other, done)
            fresh = await model_repo.get(tx.conn, entry.name)
        for e in [fresh] if fresh else []:
            self.catalog.put(e)
        return fresh or entry

    async def _forget_bytes(self, old: ModelEntry) -> None:
        """Delete an uploaded file no entry points at any more (never a user's server file)."""
        async with self.rt.db.read() as conn:
            if await model_repo.sha_in_use(conn, old.sha256):
                return
        async with self.files.lock(old.sha256):
            await asyncio.to_thread(self.files.delete, old.sha256)


def check_sources(given: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """The sources, normalised, and the server file among them (if any); errors name the index."""
    if not given:
        raise InvalidSpec("sources", "needs at least one URL, server file or 'upload'")
    if len(given) > MAX_SOURCES:
        raise InvalidSpec("sources", f"at most {MAX_SOURCES} sources")
    out: list[str] = []
    held: list[int] = []  # indices of sources the server holds (a file or an upload)
    server_file = None
    for i, source in enumerate(given):
        field = f"sources[{i}]"
        parts = urlsplit(source)
        if source == UPLOAD:
            held.append(i)
        elif parts.scheme in ("http", "https"):
            if not parts.netloc:
                raise InvalidSpec(field, f"{source!r} has no host")
        elif parts.scheme == "file" or (parts.scheme == "" and source.startswith("/")):
            path = parts.path if parts.scheme == "file" else source
            if not path.startswith("/"):
                raise InvalidSpec(field, f"{source!r} is not an absolute path")
            held.append(i)
            server_file = source = path
        else:
            raise InvalidSpec(
                field, f"{source!r}: give an http(s) URL, a file on the server, or 'upload'"
            )
        out.append(source)
    if len(held) > 1:
        raise InvalidSpec(f"sources[{held[1]}]", "only one server file or upload per model")
    return tuple(out), server_file


async def _check_server_file(
    field: str, path: str, size: int | None, sha: str | None
) -> tuple[int, str]:
    """A server file must exist; its size is read, its sha256 computed when not given."""
    file = Path(path)
    if not file.is_file():
        raise InvalidSpec(field, f"{path} is not a file on the server")
    actual = file.stat().st_size
    if size is not None and size != actual:
        raise InvalidSpec("size", f"{path} has {actual} bytes, not {size}")
    if sha is None:
        sha = await asyncio.to_thread(file_sha256, file)
    return actual, sha


def parse_content_range(header: str | None, size: int, length: int) -> int:
    """The start offset of a chunk; the header must say ``bytes a-b/<the model's size>``."""
    if header is None:
        raise InvalidSpec("Content-Range", f"is required: bytes <first>-<last>/{size}")
    match = _RANGE.match(header.strip())
    if match is None:
        raise InvalidSpec("Content-Range", f"{header!r}: write bytes <first>-<last>/{size}")
    first, last, total = (int(g) for g in match.groups())
    if total != size:
        raise InvalidSpec("Content-Range", f"the total must be the model's size, {size}")
    if last < first or last - first + 1 != length:
        raise InvalidSpec(
            "Content-Range", f"bytes {first}-{last} is {last - first + 1} bytes, the body {length}"
        )
    return first


def _registered(entry: ModelEntry, old: ModelEntry | None) -> dict[str, object]:
    """What the audit log keeps of a registration: where the bytes come from, which bytes."""
    return {
        "sources": list(entry.sources),
        "size": entry.size,
        "sha256": entry.sha256,
        "kind": entry.kind,
        "previous_sha256": old.sha256 if old is not None else None,
    }
