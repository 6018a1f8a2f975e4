"""Models on the agent's side of the link: registry refs in, the cache's state out.

* ``spec_from(ref, api_base)``: the server's ``ModelRef`` as a ``ModelSpec``;
  a relative source (``/v1/models/<name>/file``, a copy the server holds) is
  resolved against the server's API (``api_base``, from the Welcome).
* ``ModelReporter``: what the agent tells the server about its models, a
  ``ModelStatus`` (on disk, loaded per backend, downloads in flight, budget),
  sent after the Welcome and whenever it changes (a download moved, a model
  arrived or was evicted, work started or ended), at most every
  ``interval_s``. It is a level, not a log: the latest status is all that counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from corral.agent.backend_info import ObjectInfoProbe
from corral.agent.models import DownloadProgress, ModelKind, ModelManager, ModelSpec
from corral.core import CorralError, InvalidSpec
from corral.proto.gen.corral.v1 import agent_pb2 as pb

log = logging.getLogger("corral.agent.models")

REPORT_INTERVAL_S = 1.0
"""Download progress per node reaches the server about once a second, not per chunk."""


@runtime_checkable
class ReportsLoaded(Protocol):
    """Executors that know which models their backend holds in GPU memory."""

    def loaded(self) -> tuple[str, ...]: ...


def spec_from(ref: pb.ModelRef, api_base: str) -> ModelSpec:
    """A ``ModelSpec`` from the wire; raises ``InvalidSpec`` naming the field."""
    sources = []
    for i, source in enumerate(ref.sources):
        if source.startswith("/"):  # a copy the server holds, relative to its API
            if not api_base:
                raise InvalidSpec(
                    f"model.sources[{i}]", "a file on the server, but the server's API is unknown"
                )
            source = api_base + source
        sources.append(source)
    try:
        kind = ModelKind(ref.kind or ModelKind.CHECKPOINT)
    except ValueError:
        kind = ModelKind.OTHER  # a newer server's kind: fetching works the same
    return ModelSpec(ref.name, ref.size, ref.sha256, tuple(sources), kind, ref.backend)


class ModelReporter:
    """Builds the ``ModelStatus`` and says when a new one is due."""

    def __init__(
        self,
        models: ModelManager | None,
        native: Callable[[], tuple[tuple[str, ...], Mapping[str, tuple[str, ...]]]],
        executors: Mapping[str, object],
        infos: Mapping[str, ObjectInfoProbe] | None = None,
    ) -> None:
        self.models = models
        self.infos = dict(infos or {})  # backend name -> what it offers (backend_info.py)
        self._described_disk: list[str] | None = None
        self._quiet_s = min((p.refresh_s for p in self.infos.values()), default=None)
        self._native = native  # models the backends have themselves (on disk, loaded)
        self._executors = executors
        self.changed = asyncio.Event()
        self.changed.set()
        if models is not None:
            models.downloader.add_listener(self._on_progress)

    def mark(self) -> None:
        """Something changed: send a new status soon."""
        self.changed.set()

    def _on_progress(self, _: DownloadProgress) -> None:
        self.changed.set()

    def status(self) -> pb.ModelStatus:
        on_disk, loaded = self._native()
        disk = set(on_disk)
        downloads: list[pb.ModelDownload] = []
        budget = used = 0
        if self.models is not None:
            disk |= set(self.models.on_disk())
            budget, used = self.models.cache.budget, self.models.cache.used_bytes
            downloads = [_download(p) for p in self.models.downloader.progress()]
        by_backend = {k: list(v) for k, v in loaded.items()}
        for name, executor in self._executors.items():
            if isinstance(executor, ReportsLoaded):
                by_backend[name] = sorted({*by_backend.get(name, ()), *executor.loaded()})
        return pb.ModelStatus(
            models_on_disk=sorted(disk),
            loaded_by_backend={k: pb.BackendModels(models=v) for k, v in by_backend.items()},
            downloads=downloads,
            cache_budget_bytes=budget,
            cache_used_bytes=used,
        )

    async def wait_change(self, interval_s: float = REPORT_INTERVAL_S) -> None:
        """Until something changed (and at least ``interval_s`` since the last call), or,
        with backends to describe, until their description is due again."""
        await asyncio.sleep(interval_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._quiet_s):
                await self.changed.wait()
        self.changed.clear()

    def reconnected(self) -> None:
        """A new connection: the backends' descriptions travel in full again."""
        for probe in self.infos.values():
            probe.reconnected()

    async def describe(self, status: pb.ModelStatus, now: float) -> None:
        """Add what each backend offers to ``status``, read again when due or when the
        models on disk changed (a new checkpoint is a new choice in ComfyUI's lists)."""
        disk = list(status.models_on_disk)
        changed = disk != self._described_disk
        self._described_disk = disk
        for name, probe in self.infos.items():
            if changed or probe.due(now):
                await probe.refresh(now)
            message = probe.message()
            if message is not None:
                status.backend_info[name].CopyFrom(message)


def _download(p: DownloadProgress) -> pb.ModelDownload:
    return pb.ModelDownload(
        model=p.model,
        bytes_done=p.bytes_done,
        bytes_total=p.bytes_total,
        state=p.state.value,
        jobs=list(p.jobs),
        error=p.error,
    )


def api_base(address: str, tls: bool, welcome: pb.Welcome) -> str:
    """The server's HTTP API as the Welcome names it, or the dialled host on its API port."""
    if welcome.api_url:
        return welcome.api_url.rstrip("/")
    if not welcome.api_port:
        return ""
    host = address.rsplit(":", 1)[0]
    return f"{'https' if tls else 'http'}://{host}:{welcome.api_port}"


def token_headers(base: str, token: str, source: str) -> dict[str, str]:
    """The agent's token for the server's own model files, and for nothing else."""
    if base and source.startswith(base + "/"):
        return {"Authorization": f"Bearer {token}"}
    return {}


def hint(models: ModelManager, msg: pb.Prefetch, base: str) -> None:
    """The server suggests models worth having: fetch them when no job needs the slot."""
    for ref in msg.models:
        try:
            models.prefetch(spec_from(ref, base))
        except CorralError as exc:  # a bad entry or a closed cache: only a hint is lost
            log.warning("prefetch of model %s skipped: %s", ref.name, exc)
