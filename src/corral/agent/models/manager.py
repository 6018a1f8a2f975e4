"""The agent's one handle on models: the cache plus its downloader.

The agent builds one ``ModelManager`` from ``ModelSettings`` in its
composition root and uses four things:

* ``on_disk()`` for the inventory's ``models_on_disk``;
* ``async with models.use(spec, job_id=...) as path`` around a job: waits for
  the download (urgent, ahead of prefetches) and keeps the file pinned, so it
  is never evicted while the job runs;
* ``prefetch(spec)`` when the server suggests a model ahead of demand;
* ``downloader.watch()`` / ``downloader.waiting_for(job_id)`` to forward
  "waiting for model sdxl-base: 43%" to the server.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from corral.agent.models.cache import ModelCache
from corral.agent.models.downloader import Downloader
from corral.agent.models.settings import ModelSettings
from corral.agent.models.spec import ModelSpec
from corral.core import Clock


class ModelManager:
    """The model cache and its downloads, as the agent uses them."""

    def __init__(
        self, cache: ModelCache, downloader: Downloader, *, owned_client: httpx.AsyncClient | None
    ) -> None:
        self.cache = cache
        self.downloader = downloader
        self._owned_client = owned_client

    @classmethod
    def open(
        cls,
        settings: ModelSettings,
        clock: Clock,
        *,
        client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
        headers_for: Callable[[str], Mapping[str, str]] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> ModelManager:
        """Load the cache (repairing what a crash left) and make its downloader.

        ``transport`` (for the client made here) carries the trust in the server's
        certificate for the model files it holds.
        """
        cache = ModelCache(
            settings.dir, settings.budget_bytes, clock, touch_flush_s=settings.touch_flush_s
        )
        owned = None
        if client is None:
            owned = client = httpx.AsyncClient(
                timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
                follow_redirects=True,  # model hosts redirect to CDNs
                transport=transport,  # the server's pinned trust (agent/trust.py), if any
            )
        downloader = Downloader(
            cache, client, clock, settings.downloads, rng=rng, headers_for=headers_for
        )
        return cls(cache, downloader, owned_client=owned)

    def on_disk(self) -> tuple[str, ...]:
        return self.cache.on_disk()

    @asynccontextmanager
    async def use(self, spec: ModelSpec, *, job_id: str | None = None) -> AsyncIterator[Path]:
        """Wait for ``spec`` (downloading it first if needed) and keep it pinned meanwhile."""
        await self.downloader.ensure(spec, job_id=job_id)
        sha = self.cache.pin(spec.name)  # no await since ensure: it cannot have been evicted
        try:
            yield self.cache.blob_path(sha)
        finally:
            self.cache.unpin(sha)

    def prefetch(self, spec: ModelSpec) -> None:
        """Download ``spec`` in the background when no job's download needs the slot."""
        self.downloader.prefetch(spec)

    async def aclose(self) -> None:
        """Stop downloads (partials stay), write the index, close the HTTP client we made."""
        await self.downloader.aclose()
        self.cache.flush()
        if self._owned_client is not None:
            await self._owned_client.aclose()
