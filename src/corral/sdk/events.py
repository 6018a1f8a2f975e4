"""Job events and the Server-Sent Events decoder (pure: lines in, events out).

A job's event stream (``GET /v1/jobs/{id}/events``) sends one frame per
event, ``id:`` being the event's sequence number. The clients keep the last
``seq`` they handed out and reconnect with ``Last-Event-ID`` after a dropped
connection, so no event is lost or repeated.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from corral.sdk.models import _Out

TERMINAL_KINDS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})
WAIT_KINDS = tuple(sorted(TERMINAL_KINDS))  # what ``wait`` asks the server for: only the end


class JobEvent(_Out):
    """One change to a job: ``job.started``, ``job.progress``, ``job.preview``, ``job.log``, ..."""

    seq: int
    kind: str
    at: float
    job_id: str | None = None
    node: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        """The job's last event: succeeded, failed or cancelled."""
        return self.kind in TERMINAL_KINDS

    @property
    def progress(self) -> float | None:
        """0..1 on ``job.progress`` events, else None."""
        value = self.data.get("progress")
        return float(value) if isinstance(value, int | float) else None

    @property
    def message(self) -> str | None:
        value = self.data.get("message")
        return str(value) if value is not None else None

    @property
    def preview_url(self) -> str | None:
        """The preview image's path on ``job.preview`` events (fetch it with ``job.preview``)."""
        value = self.data.get("url")
        return str(value) if self.kind == "job.preview" and value else None

    @property
    def lines(self) -> list[str]:
        """Log lines on ``job.log`` events."""
        value = self.data.get("lines")
        return [str(v) for v in value] if isinstance(value, list) else []

    @property
    def state(self) -> str | None:
        value = self.data.get("state")
        return str(value) if value is not None else None

    @property
    def interrupted(self) -> bool:
        """On a job's final event: a client interrupted it (``job.succeeded`` with a partial
        result, or ``job.cancelled`` when it had made nothing)."""
        return bool(self.data.get("interrupted"))


class SseDecoder:
    """Feed it the stream's lines one by one; it returns a ``JobEvent`` at each frame's end.

    Comments (``: keep-alive``) and frames without data are skipped. Frames
    whose data is not an event (other JSON) are skipped too, so a proxy that
    injects its own frames cannot break a client.
    """

    def __init__(self) -> None:
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> JobEvent | None:
        if line.endswith("\r"):
            line = line[:-1]
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def _dispatch(self) -> JobEvent | None:
        data, self._data = "\n".join(self._data), []
        frame_id, self._id = self._id, None
        if not data:
            return None
        try:
            body = json.loads(data)
        except ValueError:
            return None
        if not isinstance(body, dict) or "kind" not in body:
            return None
        if "seq" not in body and frame_id and frame_id.isdigit():
            body["seq"] = int(frame_id)
        try:
            return JobEvent.model_validate(body)
        except ValueError:
            return None
