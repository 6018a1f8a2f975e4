"""Queries on the ``models`` table (the model registry), and its record type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.guard import guarded_update
from corral.server.store.tables import models

READY = "ready"  # every copy the server holds is complete: agents can fetch it
UPLOADING = "uploading"  # waiting for the bytes of an upload through the API
UPLOAD = "upload"
"""The source that says "the bytes come through ``PUT /v1/models/{name}/upload``"."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One registry entry, as stored."""

    name: str
    size: int
    sha256: str
    sources: tuple[str, ...]  # as registered: http(s) URLs, a server file, "upload"
    kind: str = "checkpoint"
    backend: str = ""
    state: str = READY
    server_file: str | None = None  # the file the server serves (a server file, a finished upload)
    created_at: float = 0.0
    updated_at: float = 0.0
    version: int = 1

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def urls(self) -> tuple[str, ...]:
        """The sources agents fetch from directly."""
        return tuple(s for s in self.sources if s.startswith(("http://", "https://")))


def _from_row(row: Any) -> ModelEntry:
    return ModelEntry(
        name=row.name,
        size=row.size,
        sha256=row.sha256,
        sources=tuple(row.sources),
        kind=row.kind,
        backend=row.backend,
        state=row.state,
        server_file=row.server_file,
        created_at=row.created_at,
        updated_at=row.updated_at,
        version=row.version,
    )


def _values(entry: ModelEntry) -> dict[str, Any]:
    return {
        "size": entry.size,
        "sha256": entry.sha256,
        "sources": list(entry.sources),
        "kind": entry.kind,
        "backend": entry.backend,
        "state": entry.state,
        "server_file": entry.server_file,
        "updated_at": entry.updated_at,
    }


async def get(conn: AsyncConnection, name: str) -> ModelEntry | None:
    row = (await conn.execute(sa.select(models).where(models.c.name == name))).first()
    return _from_row(row) if row else None


async def all_models(conn: AsyncConnection) -> list[ModelEntry]:
    return [_from_row(r) for r in await conn.execute(sa.select(models).order_by(models.c.name))]


async def insert(conn: AsyncConnection, entry: ModelEntry) -> None:
    values = _values(entry) | {"name": entry.name, "created_at": entry.created_at, "version": 1}
    await conn.execute(sa.insert(models).values(**values))


async def replace(conn: AsyncConnection, old: ModelEntry, new: ModelEntry) -> bool:
    """Overwrite ``old`` with ``new``; guarded by ``old.version``."""
    return await guarded_update(conn, models, ("name", old.name), old.version, _values(new))


async def delete(conn: AsyncConnection, name: str) -> bool:
    result = await conn.execute(sa.delete(models).where(models.c.name == name))
    return bool(result.rowcount == 1)


async def sha_in_use(conn: AsyncConnection, sha256: str) -> bool:
    """Does any entry still point at these bytes (two names may share one file)?"""
    query = sa.select(models.c.name).where(models.c.sha256 == sha256).limit(1)
    return (await conn.execute(query)).first() is not None
