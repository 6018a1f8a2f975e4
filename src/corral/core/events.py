"""Events: the append-only record of every change.

They feed SSE streams, the dashboard, audit and trace replay (``corral sim``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Final

from corral.core.model import EMPTY, frozen_map


class EventKind(StrEnum):
    JOB_SUBMITTED = "job.submitted"
    JOB_QUEUED = "job.queued"  # a waiting job's dependencies were met: it entered the queue
    JOB_PLACED = "job.placed"
    JOB_STARTED = "job.started"
    JOB_PROGRESS = "job.progress"
    JOB_PREVIEW = "job.preview"
    JOB_LOG = "job.log"
    JOB_CHECKPOINT = "job.checkpoint"
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    JOB_REQUEUED = "job.requeued"
    JOB_PREEMPTED = "job.preempted"
    NODE_JOINED = "node.joined"
    NODE_LOST = "node.lost"
    NODE_PAUSED = "node.paused"
    NODE_RESUMED = "node.resumed"
    NODE_DRAINING = "node.draining"
    NODE_LAUNCHED = "node.launched"  # the autoscaler asked its provider for this machine
    NODE_REMOVED = "node.removed"  # forgotten: the autoscaler removed its machine
    TEAM_UPDATED = "team.updated"


TERMINAL_JOB_EVENTS = frozenset(
    {EventKind.JOB_SUCCEEDED, EventKind.JOB_FAILED, EventKind.JOB_CANCELLED}
)


@dataclass(frozen=True, slots=True)
class Event:
    """One change. ``seq`` is assigned by the store and orders all events."""

    kind: EventKind
    at: float
    job_id: str | None = None
    node: str | None = None
    data: Mapping[str, Any] = field(default_factory=lambda: EMPTY)
    seq: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", frozen_map(self.data))

    def numbered(self, seq: int) -> Event:
        """This event with the ``seq`` the store gave it (``replace`` without re-freezing
        ``data``, which is frozen already: a committed event's copy, four per job)."""
        twin = object.__new__(Event)
        for name in _COPIED:
            object.__setattr__(twin, name, getattr(self, name))
        object.__setattr__(twin, "seq", seq)
        return twin


_COPIED: Final = tuple(f.name for f in fields(Event) if f.name != "seq")
