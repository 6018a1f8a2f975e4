"""``Job``: a handle on one submitted job (follow it, wait for it, stop it, get its result)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from corral.sdk.calls import Call, get_job
from corral.sdk.errors import WaitTimeout
from corral.sdk.events import WAIT_KINDS, JobEvent
from corral.sdk.handle import Handle
from corral.sdk.models import Delivery, JobStatus, ResultFile
from corral.sdk.results import check_result, pick_file, save_path
from corral.sdk.retry import Follow

if TYPE_CHECKING:
    from corral.sdk.client import Client


class EventStream:
    """An iterator over a job's events that reconnects by itself.

    ``reconnects`` counts how often the connection was re-established (it
    resumes after ``last_seq`` each time, so nothing is lost or repeated).
    """

    def __init__(self, events: Iterator[JobEvent], follow: Follow) -> None:
        self._events = events
        self._follow = follow

    def __iter__(self) -> Iterator[JobEvent]:
        return self

    def __next__(self) -> JobEvent:
        return next(self._events)

    @property
    def last_seq(self) -> int:
        return self._follow.last

    @property
    def reconnects(self) -> int:
        return self._follow.reconnects

    def close(self) -> None:
        """Stop following (closes the connection)."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()


class Job(Handle[JobStatus]):
    """A submitted job. ``status`` is what the server said last; ``refresh()`` asks again."""

    def _state(self) -> str:
        return self.status.outcome

    def _get(self) -> Call[JobStatus]:
        return get_job(self.id)

    def events(
        self, *, after: int = 0, idle_timeout: float | None = None, kinds: Iterable[str] = ()
    ) -> EventStream:
        """The job's events from the start (or after seq ``after``), live, until its final one.

        Progress (``event.progress``), previews (``event.preview_url``, fetch
        with ``preview``), logs (``event.lines``) and state changes. A dropped
        connection is resumed with Last-Event-ID. ``idle_timeout``: stop when
        no event came for that many seconds (to read what is there and leave).
        ``kinds`` (e.g. ``["job.progress", "job.succeeded"]``): only those; the
        server leaves the others out of the stream.
        """
        return self.client.events(self.id, after=after, idle_timeout=idle_timeout, kinds=kinds)

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job ends; returns its final status (check ``status.state``).

        Raises ``WaitTimeout`` after ``timeout`` seconds (the job goes on).
        """
        if self.refresh().done:
            return self.status
        deadline = None if timeout is None else time.monotonic() + timeout
        follow = Follow(
            self.id, self.client.url, self.client.retry, deadline=deadline, kinds=WAIT_KINDS
        )
        follow.timeout = timeout
        try:
            for _ in self.client.stream_events(follow):
                pass
        except WaitTimeout:
            raise WaitTimeout(self.id, timeout or 0.0, self.refresh().state.value) from None
        return self.refresh()

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the job, then its result files. Raises ``JobFailed`` if it did not succeed."""
        self.wait(timeout)
        status = self.client.result_status(self.id)
        check_result(status)
        return Result(self.client, self.id, status.files)

    def cancel(self) -> JobStatus:
        """End the job now; running work is told to stop. Cancelling twice is harmless."""
        self.status = self.client.stop_job(self.id, "cancel")
        return self.status

    def hold(self) -> JobStatus:
        """Keep it queued but never placed until ``release`` (only while queued)."""
        self.status = self.client.edit_job(self.id, hold=True)
        return self.status

    def release(self) -> JobStatus:
        """Let a held job be placed again."""
        self.status = self.client.edit_job(self.id, hold=False)
        return self.status

    def top(self) -> JobStatus:
        """Make it its user's next job (before that user's older queued jobs)."""
        self.status = self.client.edit_job(self.id, top=True)
        return self.status

    def deliveries(self) -> list[Delivery]:
        """Its webhook calls, each with its attempts."""
        return self.client.deliveries(self.id)

    def interrupt(self) -> JobStatus:
        """Stop early and keep what was made so far as the result (not started: cancelled)."""
        self.status = self.client.stop_job(self.id, "interrupt")
        return self.status

    def delete(self) -> None:
        """Delete the finished job with its events, results and previews (``Conflict`` while
        it is queued or running: cancel it first)."""
        self.client.delete_job(self.id)

    def preview(self, event: JobEvent | str) -> bytes:
        """The image of a ``job.preview`` event (or a preview URL)."""
        url = event if isinstance(event, str) else event.preview_url
        if not url:
            raise ValueError(f"not a preview event: {event!r}")
        return self.client.download(url)


class Result:
    """A finished job's files. ``read`` one, or ``save`` all to a directory."""

    def __init__(self, client: Client, job_id: str, files: list[ResultFile]) -> None:
        self.client = client
        self.job_id = job_id
        self.files = files

    def __repr__(self) -> str:
        return f"Result({self.job_id!r}, files={[f.name for f in self.files]})"

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    def read(self, name: str | None = None) -> bytes:
        """The bytes of file ``name`` (default: the only file, or the first)."""
        return self.client.download(pick_file(self.files, name, self.job_id).url)

    def save(self, directory: str | Path) -> list[Path]:
        """Write every file into ``directory`` (created if needed); returns the paths."""
        out = []
        for f in self.files:
            path = save_path(Path(directory), f.name)
            path.write_bytes(self.client.download(f.url))
            out.append(path)
        return out
