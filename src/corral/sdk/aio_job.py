"""``AsyncJob``: the asyncio twin of ``Job`` (same methods, awaited)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from corral.sdk.calls import Call, get_job
from corral.sdk.errors import WaitTimeout
from corral.sdk.events import WAIT_KINDS, JobEvent
from corral.sdk.handle import AsyncHandle
from corral.sdk.models import Delivery, JobStatus, ResultFile
from corral.sdk.results import check_result, pick_file, save_path
from corral.sdk.retry import Follow

if TYPE_CHECKING:
    from corral.sdk.aio import AsyncClient


class AsyncEventStream:
    """An async iterator over a job's events that reconnects by itself (see ``EventStream``)."""

    def __init__(self, events: AsyncIterator[JobEvent], follow: Follow) -> None:
        self._events = events
        self._follow = follow

    def __aiter__(self) -> AsyncIterator[JobEvent]:
        return self

    async def __anext__(self) -> JobEvent:
        return await anext(self._events)

    @property
    def last_seq(self) -> int:
        return self._follow.last

    @property
    def reconnects(self) -> int:
        return self._follow.reconnects

    async def aclose(self) -> None:
        close = getattr(self._events, "aclose", None)
        if close is not None:
            await close()


class AsyncJob(AsyncHandle[JobStatus]):
    """A submitted job, for asyncio code."""

    def _state(self) -> str:
        return self.status.outcome

    def _get(self) -> Call[JobStatus]:
        return get_job(self.id)

    def events(
        self, *, after: int = 0, idle_timeout: float | None = None, kinds: Iterable[str] = ()
    ) -> AsyncEventStream:
        """The job's events, live, resumed after a dropped connection (see ``Job.events``)."""
        return self.client.events(self.id, after=after, idle_timeout=idle_timeout, kinds=kinds)

    async def wait(self, timeout: float | None = None) -> JobStatus:
        """Until the job ends; its final status. ``WaitTimeout`` after ``timeout`` seconds."""
        if (await self.refresh()).done:
            return self.status
        follow = Follow(self.id, self.client.url, self.client.retry, kinds=WAIT_KINDS)
        stream = self.client.stream_events(follow)
        try:
            async with asyncio.timeout(timeout):
                async for _ in stream:
                    pass
        except TimeoutError:
            state = (await self.refresh()).state.value
            raise WaitTimeout(self.id, timeout or 0.0, state) from None
        finally:
            await stream.aclose()
        return await self.refresh()

    async def result(self, timeout: float | None = None) -> AsyncResult:
        """Wait, then the result files; ``JobFailed`` if the job did not succeed."""
        await self.wait(timeout)
        status = await self.client.result_status(self.id)
        check_result(status)
        return AsyncResult(self.client, self.id, status.files)

    async def cancel(self) -> JobStatus:
        self.status = await self.client.stop_job(self.id, "cancel")
        return self.status

    async def hold(self) -> JobStatus:
        """Keep it queued but never placed until ``release`` (only while queued)."""
        self.status = await self.client.edit_job(self.id, hold=True)
        return self.status

    async def release(self) -> JobStatus:
        """Let a held job be placed again."""
        self.status = await self.client.edit_job(self.id, hold=False)
        return self.status

    async def top(self) -> JobStatus:
        """Make it its user's next job (before that user's older queued jobs)."""
        self.status = await self.client.edit_job(self.id, top=True)
        return self.status

    async def deliveries(self) -> list[Delivery]:
        """Its webhook calls, each with its attempts."""
        return await self.client.deliveries(self.id)

    async def interrupt(self) -> JobStatus:
        self.status = await self.client.stop_job(self.id, "interrupt")
        return self.status

    async def delete(self) -> None:
        await self.client.delete_job(self.id)

    async def preview(self, event: JobEvent | str) -> bytes:
        url = event if isinstance(event, str) else event.preview_url
        if not url:
            raise ValueError(f"not a preview event: {event!r}")
        return await self.client.download(url)


class AsyncResult:
    """A finished job's files, for asyncio code."""

    def __init__(self, client: AsyncClient, job_id: str, files: list[ResultFile]) -> None:
        self.client = client
        self.job_id = job_id
        self.files = files

    def __repr__(self) -> str:
        return f"AsyncResult({self.job_id!r}, files={[f.name for f in self.files]})"

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    async def read(self, name: str | None = None) -> bytes:
        return await self.client.download(pick_file(self.files, name, self.job_id).url)

    async def save(self, directory: str | Path) -> list[Path]:
        out = []
        for f in self.files:
            path = save_path(Path(directory), f.name)
            path.write_bytes(await self.client.download(f.url))
            out.append(path)
        return out
