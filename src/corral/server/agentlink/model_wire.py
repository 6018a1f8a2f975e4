"""Models on the agent link (issue 10): what the server sends and hears about them.

* ``ModelRef``: a registry entry attached to every assignment whose job names
  a registered model, and to prefetch hints. Sources the agents fetch directly
  are URLs; a copy the server holds is the relative URL
  ``/v1/models/<name>/file``, which the agent resolves against the API
  location the Welcome gave it (``api_url``, or the host it dialled on
  ``api_port``).
* ``ModelReport``: the agent's cache as it is now (models on disk and loaded,
  downloads in flight, budget), sent after the Welcome and on change.

Pure conversions to and from the protobuf messages; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from corral.proto.gen.corral.v1 import agent_pb2 as pb


@dataclass(frozen=True, slots=True)
class ModelRef:
    name: str
    size: int
    sha256: str
    sources: tuple[str, ...]
    kind: str = "checkpoint"
    backend: str = ""


@dataclass(frozen=True, slots=True)
class DownloadInfo:
    """One download on a node: how far, and which jobs wait for it."""

    model: str
    bytes_done: int
    bytes_total: int
    state: str = "fetching"
    jobs: tuple[str, ...] = ()
    error: str = ""

    @property
    def fraction(self) -> float:
        return min(1.0, self.bytes_done / self.bytes_total) if self.bytes_total else 0.0


@dataclass(frozen=True, slots=True)
class ModelReport:
    on_disk: frozenset[str] = frozenset()
    loaded: frozenset[str] = frozenset()
    downloads: tuple[DownloadInfo, ...] = ()
    budget_bytes: int = 0
    used_bytes: int = 0


RefLookup = Callable[[str], ModelRef | None]
"""A registry lookup by name (``None``: not registered)."""


def no_refs(_name: str) -> ModelRef | None:
    return None


def ref_message(ref: ModelRef) -> pb.ModelRef:
    return pb.ModelRef(
        name=ref.name,
        size=ref.size,
        sha256=ref.sha256,
        kind=ref.kind,
        backend=ref.backend,
        sources=list(ref.sources),
    )


def attach_refs(msg: pb.ServerMessage, lookup: RefLookup) -> pb.ServerMessage:
    """Fill ``model_ref`` of each job of an assignment from the registry."""
    if not msg.HasField("assign"):
        return msg
    for work in msg.assign.jobs:
        ref = lookup(work.model) if work.model else None
        if ref is not None:
            work.model_ref.CopyFrom(ref_message(ref))
    return msg


def prefetch_message(refs: list[ModelRef]) -> pb.ServerMessage:
    return pb.ServerMessage(prefetch=pb.Prefetch(models=[ref_message(r) for r in refs]))


def report_from(msg: pb.ModelStatus) -> ModelReport:
    loaded = {m for models in msg.loaded_by_backend.values() for m in models.models}
    return ModelReport(
        on_disk=frozenset(msg.models_on_disk),
        loaded=frozenset(loaded),
        downloads=tuple(
            DownloadInfo(
                model=d.model,
                bytes_done=d.bytes_done,
                bytes_total=d.bytes_total,
                state=d.state or "fetching",
                jobs=tuple(d.jobs),
                error=d.error,
            )
            for d in msg.downloads
        ),
        budget_bytes=msg.cache_budget_bytes,
        used_bytes=msg.cache_used_bytes,
    )
