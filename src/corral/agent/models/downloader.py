"""Background downloads into the cache: a priority queue, a few in parallel.

``request(spec, job_id=...)`` queues a model (once per sha256, however many
ask) and returns a future of its path. Queue order is ``(priority, arrival)``:
a download an assigned job waits for (``Priority.JOB``) goes before every
prefetch, and when all slots are busy with prefetches one of them is paused
(its partial file kept, resumed later) so the job's model starts at once.

Each download reserves its size in the cache (evicting as needed), then tries
its sources in order. A transient failure (dropped connection, timeout, 5xx)
is retried on the same source after a backoff on the injected ``Clock``; a
try that made progress resets the count, so a flaky link that keeps
delivering gets there. A permanent failure (404, wrong size) or running out
of retries moves to the next source, resuming the same partial file (it is
the same bytes, by sha256). When every byte is there the sha256 is compared;
a mismatch deletes the file and names both hashes. Only then does the file
enter the cache.

Progress (``DownloadProgress``) is published on every state change and every
``progress_step`` of the bytes or ``progress_interval_s`` of clock time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from corral.agent.models.cache import ModelCache
from corral.agent.models.errors import DownloadFailed, IntegrityError, ModelError, SourceError
from corral.agent.models.fetch import FetchRequest, Hashed, PartFile, fetch
from corral.agent.models.progress import Listener, ProgressHub
from corral.agent.models.settings import DownloadSettings
from corral.agent.models.spec import (
    DOWNLOAD,
    DownloadProgress,
    DownloadState,
    ModelSpec,
    Priority,
)
from corral.core import Clock, Transition, transition

log = logging.getLogger(__name__)
HISTORIES_KEPT = 256  # models whose last download's history ``history()`` can still show


@dataclass(eq=False)
class _Download:
    spec: ModelSpec
    seq: int  # arrival order, the queue's tie-breaker
    priority: Priority
    done: asyncio.Future[Path]
    jobs: set[str] = field(default_factory=set)
    state: DownloadState = DownloadState.QUEUED
    bytes_done: int = 0
    writes: int = 0  # bumps on every write: "did this try make progress?"
    task: asyncio.Task[None] | None = None
    pausing: bool = False
    hashed: Hashed | None = None  # the partial file's digest when it was last closed
    history: list[Transition] = field(default_factory=list)
    published: tuple[float, float] = (-1.0, float("-inf"))  # (fraction, clock time)

    def progress(self, error: str = "") -> DownloadProgress:
        return DownloadProgress(
            self.spec.name,
            self.bytes_done,
            self.spec.size,
            self.state,
            tuple(sorted(self.jobs)),
            error,
        )


class Downloader:
    """Fetches models into a ``ModelCache`` in the background, most urgent first."""

    def __init__(
        self,
        cache: ModelCache,
        client: httpx.AsyncClient,
        clock: Clock,
        settings: DownloadSettings | None = None,
        *,
        rng: random.Random | None = None,
        headers_for: Callable[[str], Mapping[str, str]] | None = None,
    ) -> None:
        self._cache = cache
        self._client = client
        self._clock = clock
        self.settings = settings or DownloadSettings()
        self._rng = rng or random.Random()  # jitter differs per agent unless a test seeds it
        self._headers_for = headers_for or (lambda _source: {})  # auth only where it belongs
        self._downloads: dict[str, _Download] = {}  # sha256 -> its download
        self._queue: list[tuple[int, int, str]] = []  # (priority, seq, sha256); stale ok
        self._running: set[_Download] = set()
        self._seq = itertools.count()
        self._histories: dict[str, list[Transition]] = {}  # model -> its latest download's
        self._hub = ProgressHub()
        self._closed = False

    # ---- asking for models --------------------------------------------------

    def request(self, spec: ModelSpec, *, job_id: str | None = None) -> asyncio.Future[Path]:
        """Queue ``spec`` (a job's need when ``job_id`` is given, else a prefetch)."""
        if self._closed:
            raise ModelError(spec.name, "the downloader is closed")
        if self._cache.link(spec):
            ready: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
            ready.set_result(self._cache.blob_path(spec.sha256))
            return ready
        download = self._downloads.get(spec.sha256) or self._add(spec)
        if job_id is not None:
            download.jobs.add(job_id)
            self._raise_priority(download, Priority.JOB)
        self._dispatch()
        return download.done

    def prefetch(self, spec: ModelSpec) -> asyncio.Future[Path]:
        """Fetch ``spec`` when no job's download needs the slot."""
        return self.request(spec)

    async def ensure(self, spec: ModelSpec, *, job_id: str | None = None) -> Path:
        """Wait until ``spec`` is in the cache under its name; raise ``ModelError`` if it fails.

        On return the file is linked and, with no await in between, the caller
        may ``cache.pin`` it. Cancelling a waiting job does not cancel the
        download: it carries on as a prefetch.
        """
        try:
            while not self._cache.link(spec):
                await asyncio.shield(self.request(spec, job_id=job_id))
        finally:
            if job_id is not None:
                self.forget_job(job_id, spec.sha256)
        return self._cache.blob_path(spec.sha256)

    def forget_job(self, job_id: str, sha256: str | None = None) -> None:
        """``job_id`` waits no more (for ``sha256``, or for anything).

        Downloads nobody else waits for carry on as prefetches.
        """
        for download in self._downloads.values():
            if job_id in download.jobs and sha256 in (None, download.spec.sha256):
                download.jobs.discard(job_id)
                if not download.jobs:
                    download.priority = Priority.PREFETCH
                    self._push(download)

    # ---- observing ------------------------------------------------------------

    def progress(self) -> list[DownloadProgress]:
        """Every download not yet done or failed, most urgent first."""
        active = sorted(self._downloads.values(), key=lambda d: (d.priority, d.seq))
        return [d.progress() for d in active]

    def waiting_for(self, job_id: str) -> list[DownloadProgress]:
        """The downloads ``job_id`` waits for: "waiting for model sdxl-base: 43%"."""
        return [p for p in self.progress() if job_id in p.jobs]

    def history(self, model: str) -> list[Transition]:
        """The state changes of ``model``'s latest download (for logs and tests)."""
        return list(self._histories.get(model, []))

    def watch(self) -> AsyncIterator[DownloadProgress]:
        return self._hub.watch()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        return self._hub.add_listener(listener)

    async def aclose(self) -> None:
        """Stop every download (partial files stay for next time) and fail their waiters."""
        self._closed = True
        tasks = [d.task for d in self._running if d.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for download in list(self._downloads.values()):
            self._finish(download, ModelError(download.spec.name, "the downloader closed"))
        self._hub.close()

    # ---- the queue ------------------------------------------------------------

    def _add(self, spec: ModelSpec) -> _Download:
        done: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # no "never retrieved"
        download = _Download(spec, next(self._seq), Priority.PREFETCH, done)
        self._downloads[spec.sha256] = download
        self._histories.pop(spec.name, None)
        self._histories[spec.name] = download.history
        while len(self._histories) > HISTORIES_KEPT:
            del self._histories[next(iter(self._histories))]
        self._push(download)
        self._publish(download, force=True)
        return download

    def _raise_priority(self, download: _Download, priority: Priority) -> None:
        if priority < download.priority:
            download.priority = priority
            self._push(download)

    def _push(self, download: _Download) -> None:
        if download.state is DownloadState.QUEUED:
            heapq.heappush(self._queue, (download.priority, download.seq, download.spec.sha256))

    def _next_queued(self) -> _Download | None:
        """The most urgent queued download, dropping stale heap entries on the way."""
        while self._queue:
            priority, _, sha = self._queue[0]
            download = self._downloads.get(sha)
            if (
                download
                and download.state is DownloadState.QUEUED
                and download.priority == priority
            ):
                return download
            heapq.heappop(self._queue)
        return None

    def _dispatch(self) -> None:
        """Start queued downloads while slots are free; make room for a job's if none is."""
        while not self._closed and (head := self._next_queued()):
            if len(self._running) < self.settings.parallel:
                heapq.heappop(self._queue)
                self._start(head)
                continue
            if head.priority is Priority.JOB and self.settings.preempt_prefetch:
                self._pause_a_prefetch()
            return

    def _pause_a_prefetch(self) -> None:
        """Pause the newest running prefetch, unless one is already pausing."""
        if any(d.pausing for d in self._running):
            return
        prefetches = [
            d
            for d in self._running
            if d.priority is Priority.PREFETCH and d.state is not DownloadState.VERIFYING
        ]
        if prefetches and (victim := max(prefetches, key=lambda d: d.seq)).task:
            victim.pausing = True
            victim.task.cancel()

    def _start(self, download: _Download) -> None:
        self._move(download, DownloadState.FETCHING, "a slot was free")
        self._running.add(download)
        download.task = asyncio.get_running_loop().create_task(self._run(download))
        download.task.add_done_callback(lambda _t: self._ended(download))

    def _ended(self, download: _Download) -> None:
        """A download's task ended: requeue it if it was paused, then fill the slot."""
        self._running.discard(download)
        if download.pausing and download.state not in DOWNLOAD.terminal:
            download.pausing = False
            self._cache.release(download.spec.sha256)
            self._move(download, DownloadState.QUEUED, "paused for a job's download")
            self._push(download)
        self._dispatch()

    # ---- one download -------------------------------------------------------

    async def _run(self, download: _Download) -> None:
        try:
            path = await self._download(download)
        except ModelError as exc:
            self._finish(download, exc)
        except Exception as exc:  # disk full, an odd URL, a bug: fail it, never leave it hanging
            if not isinstance(exc, OSError | httpx.HTTPError):
                log.exception("download of model %s failed unexpectedly", download.spec.name)
            message = f"model {download.spec.name}: {type(exc).__name__}: {exc}"
            self._finish(download, ModelError(download.spec.name, message))
        else:
            self._finish(download, path)

    async def _download(self, download: _Download) -> Path:
        spec = download.spec
        self._cache.reserve(spec)  # may evict; CacheFull when the space is pinned
        try:
            path = self._cache.part_path(spec.sha256)
            part = await PartFile.open(path, spec.size, known=download.hashed)
            try:
                return await self._from_sources(download, part)
            finally:
                download.hashed = part.close()  # a resume after a pause need not re-hash
        finally:
            self._cache.release(spec.sha256)

    async def _from_sources(self, download: _Download, part: PartFile) -> Path:
        spec, errors = download.spec, list[ModelError]()
        for source in spec.sources:
            try:
                await self._fetch_with_retries(download, part, source)
            except SourceError as exc:
                errors.append(exc)
                continue
            self._move(download, DownloadState.VERIFYING, f"all bytes from {source}")
            await asyncio.to_thread(part.sync)
            actual = part.hexdigest()
            if actual == spec.sha256:
                return self._cache.commit(spec)
            errors.append(IntegrityError(spec.name, spec.sha256, actual, source))
            part.restart()
            download.bytes_done = 0
            if source != spec.sources[-1]:
                self._move(download, DownloadState.FETCHING, "sha256 mismatch: next source")
        if part.offset == 0:
            part.delete()
        raise DownloadFailed(spec.name, errors)

    async def _fetch_with_retries(self, download: _Download, part: PartFile, source: str) -> None:
        request = FetchRequest(
            model=download.spec.name,
            source=source,
            total=download.spec.size,
            chunk_bytes=self.settings.chunk_bytes,
            on_bytes=lambda offset, settled: self._on_bytes(download, offset, settled),
            headers=self._headers_for(source),
        )
        failures = 0
        while True:
            writes_before = download.writes
            try:
                await fetch(request, part, self._client)
                return
            except SourceError as exc:
                if not exc.transient:
                    raise
                failures = 1 if download.writes > writes_before else failures + 1
                if failures > self.settings.retries:
                    raise
                self._move(download, DownloadState.RETRYING, str(exc))
                await self._clock.sleep(self._backoff(failures, exc.retry_after))
                self._move(download, DownloadState.FETCHING, f"retry {failures} of {source}")

    def _backoff(self, failures: int, retry_after: float | None) -> float:
        """Exponential delay (with jitter), at least what the server asked for, capped."""
        delay: float = self.settings.backoff_s * 2.0 ** (failures - 1)
        delay *= 1 + self.settings.jitter * (2 * self._rng.random() - 1)
        return min(self.settings.backoff_max_s, max(delay, retry_after or 0.0))

    def _on_bytes(self, download: _Download, offset: int, settled: bool) -> None:
        if offset != download.bytes_done:
            download.writes += 1
            download.bytes_done = offset
        self._publish(download, force=settled)

    # ---- state and progress -----------------------------------------------------

    def _move(
        self, download: _Download, target: DownloadState, why: str, *, error: str = ""
    ) -> None:
        download.state = transition(
            DOWNLOAD,
            download.spec.name,
            download.state,
            target,
            at=self._clock.now(),
            why=why,
            history=download.history,
        )
        self._publish(download, force=True, error=error)

    def _finish(self, download: _Download, outcome: Path | ModelError) -> None:
        if download.state in DOWNLOAD.terminal:
            return
        self._downloads.pop(download.spec.sha256, None)
        if isinstance(outcome, Path):
            download.bytes_done = download.spec.size
            self._move(download, DownloadState.DONE, "verified and in the cache")
            download.done.set_result(outcome)
        else:
            self._move(download, DownloadState.FAILED, str(outcome), error=str(outcome))
            download.done.set_exception(outcome)

    def _publish(self, download: _Download, *, force: bool = False, error: str = "") -> None:
        """Publish when forced (a state change) or when enough bytes or time passed."""
        progress, now = download.progress(error), self._clock.now()
        last_fraction, last_at = download.published
        due = progress.fraction - last_fraction >= self.settings.progress_step
        if force or due or now - last_at >= self.settings.progress_interval_s:
            download.published = (progress.fraction, now)
            self._hub.publish(progress)
