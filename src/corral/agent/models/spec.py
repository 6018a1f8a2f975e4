"""What a model is (``ModelSpec``), how urgent its download is, and how far it got.

A ``ModelSpec`` comes from the server's registry with every assignment that
names a model: its registry name, kind, the backend it is for, its exact size
and sha256, and where to fetch it from (http(s) URLs or files, tried in order).
The agent never guesses any of these; a spec that does not validate is refused
with ``InvalidSpec`` naming the field.

A download moves through the ``DOWNLOAD`` lifecycle table below; every change
goes through ``corral.core.transition`` so its history explains it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corral.core import InvalidSpec, Lifecycle, parse_bytes


class ModelKind(StrEnum):
    CHECKPOINT = "checkpoint"  # a full model (SD checkpoint, LLM weights)
    LORA = "lora"  # a low-rank adapter applied on top of a checkpoint
    VAE = "vae"
    EMBEDDING = "embedding"  # a textual-inversion embedding
    CONTROLNET = "controlnet"
    UPSCALER = "upscaler"
    OTHER = "other"


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@:/-]{0,199}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One registry entry, as the agent needs it to fetch and check the file."""

    name: str
    size: int  # exact bytes; a source serving another size is wrong
    sha256: str  # lowercase hex; the file is used only once this matches
    sources: tuple[str, ...]  # http(s) URLs, file:// URLs or absolute paths, in order
    kind: ModelKind = ModelKind.CHECKPOINT
    backend: str = ""  # "a1111", "comfyui", ...; empty: any backend

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha256", self.sha256.lower())
        object.__setattr__(self, "sources", tuple(self.sources))
        validate(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, field_prefix: str = "model") -> ModelSpec:
        """Build from JSON-like data (an assignment's model entry); sizes may read "2GiB"."""
        for key in ("name", "size", "sha256", "sources"):
            if key not in data:
                raise InvalidSpec(f"{field_prefix}.{key}", "is required")
        sources = data["sources"]
        if isinstance(sources, str) or not isinstance(sources, list | tuple):
            raise InvalidSpec(f"{field_prefix}.sources", "must be a list of URLs or paths")
        try:
            kind = ModelKind(data.get("kind", ModelKind.CHECKPOINT))
        except ValueError:
            known = ", ".join(k.value for k in ModelKind)
            raise InvalidSpec(
                f"{field_prefix}.kind", f"unknown kind {data.get('kind')!r} (one of {known})"
            ) from None
        return cls(
            name=str(data["name"]),
            size=parse_bytes(data["size"], field_name=f"{field_prefix}.size"),
            sha256=str(data["sha256"]),
            sources=tuple(str(s) for s in sources),
            kind=kind,
            backend=str(data.get("backend", "")),
        )


def validate(spec: ModelSpec) -> None:
    """Raise ``InvalidSpec`` naming the first field of ``spec`` that is wrong."""
    if not _NAME.match(spec.name):
        raise InvalidSpec(
            "model.name", f"{spec.name!r} is not a model name (letters, digits, ._+@:/-)"
        )
    if not isinstance(spec.size, int) or spec.size <= 0:
        raise InvalidSpec("model.size", f"must be a positive number of bytes, got {spec.size!r}")
    if not _SHA256.match(spec.sha256):
        raise InvalidSpec("model.sha256", f"must be 64 hex digits, got {spec.sha256!r}")
    if not spec.sources:
        raise InvalidSpec("model.sources", "needs at least one URL or path")
    for i, source in enumerate(spec.sources):
        problem = source_problem(source)
        if problem:
            raise InvalidSpec(f"model.sources[{i}]", problem)


def source_problem(source: str) -> str:
    """Why ``source`` cannot be fetched from, or "" when it can."""
    parts = urlsplit(source)
    if parts.scheme in ("http", "https"):
        return "" if parts.netloc else f"{source!r} has no host"
    if parts.scheme == "file":
        return "" if parts.path.startswith("/") else f"{source!r} is not an absolute file URL"
    if parts.scheme == "" and Path(source).is_absolute():
        return ""
    return f"{source!r} is not an http(s) URL, a file:// URL or an absolute path"


class Priority(IntEnum):
    """How urgent a download is: lower runs first."""

    JOB = 0  # an assigned job waits for it
    PREFETCH = 1  # wanted ahead of demand; nobody waits


class DownloadState(StrEnum):
    QUEUED = "queued"
    FETCHING = "fetching"
    RETRYING = "retrying"  # waiting out a backoff before trying a source again
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"


_Q, _F, _R, _V = (
    DownloadState.QUEUED,
    DownloadState.FETCHING,
    DownloadState.RETRYING,
    DownloadState.VERIFYING,
)
DOWNLOAD: Lifecycle[DownloadState] = Lifecycle(
    "download",
    {
        (_Q, _F): "a download slot was free and it was the most urgent in the queue",
        (_Q, DownloadState.FAILED): "the downloader closed before it started",
        (_F, _Q): "paused (partial file kept) so a download a job waits for can go first",
        (_F, _R): "a source failed in a way another try may fix (dropped, 5xx, timeout)",
        (_F, _V): "every byte arrived; checking size and sha256",
        (_F, DownloadState.DONE): "its file was already in the cache (another name, a restart)",
        (_F, DownloadState.FAILED): "every source failed, or the cache cannot make room",
        (_R, _F): "the backoff passed; trying the source again",
        (_R, _Q): "paused during a backoff so a download a job waits for can go first",
        (_R, DownloadState.FAILED): "the downloader closed while it waited",
        (_V, DownloadState.DONE): "the sha256 matched; the file is in the cache",
        (_V, _F): "the sha256 did not match: file deleted, trying the next source",
        (_V, DownloadState.FAILED): "the sha256 did not match and no source is left",
    },
    terminal=frozenset({DownloadState.DONE, DownloadState.FAILED}),
)


@dataclass(frozen=True, slots=True)
class DownloadProgress:
    """How far one model's download got, and which jobs wait for it."""

    model: str
    bytes_done: int
    bytes_total: int
    state: DownloadState = DownloadState.FETCHING
    jobs: tuple[str, ...] = ()  # jobs waiting for this model; empty for a prefetch
    error: str = ""  # why it failed, when state is FAILED

    @property
    def fraction(self) -> float:
        return min(1.0, self.bytes_done / self.bytes_total) if self.bytes_total else 1.0

    @property
    def percent(self) -> int:
        """Whole percent done, rounded down so 100 means really done."""
        return int(self.fraction * 100)

    @property
    def message(self) -> str:
        """The line a waiting job shows, e.g. ``waiting for model sdxl-base: 43%``."""
        if self.state is DownloadState.FAILED:
            return f"model {self.model} failed to download: {self.error}"
        if self.state is DownloadState.DONE:
            return f"model {self.model} is ready"
        if self.state is DownloadState.VERIFYING:
            return f"verifying model {self.model}"
        return f"waiting for model {self.model}: {self.percent}%"
