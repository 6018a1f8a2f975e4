"""When the scheduler's answer can change with nothing arriving or ending.

A cycle's decision depends on ``now`` in three places, and in each the
passing of time alone can let a waiting job run:

* a running allocation may be preempted only once it has run
  ``Config.min_runtime_before_preemption_s`` (``preemption.py``): a reclaim
  or a higher class waiting for it becomes possible at start + that time;
* a requeued job waits out its retry backoff (``Job.not_before``);
* a job that waits for a busy node holding its model stops waiting at
  submission + ``Config.model_max_wait_s`` and fetches it elsewhere
  (``routing.py``).

Everything else that moves with time only narrows what may run (a
reservation's backfill window shrinks as ``now`` grows), so no waiting job
gains from a cycle at that moment. ``Timers`` keeps one heap of those
instants, so both shells (the server's scheduling loop and the simulator)
ask the same ``wake_at(now)`` when to run a cycle that no event will
trigger. Entries are dropped lazily: one whose job or allocation is gone, or
whose time has passed, is popped when it reaches the top, so the cost is
O(log n) per change and the heap holds only instants still to come or not
yet looked at.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from corral.core.model import Allocation, Job, PriorityClass
from corral.scheduler.api import Config

ALLOC = 0  # an allocation passing its minimum run time
JOB = 1  # a job's backoff ending, or its wait for a model holder running out


class Timers:
    """Instants at which a cycle may decide differently, whatever else happens."""

    def __init__(self, config: Config, classes: Mapping[str, PriorityClass]) -> None:
        self._min_runtime_s = config.min_runtime_before_preemption_s
        self._preemption = config.preemption
        self._model_wait_s = (
            config.model_max_wait_s if config.model_fetch_bytes_per_s is not None else None
        )
        self._classes = classes
        self._heap: list[tuple[float, int, str]] = []  # (when, ALLOC/JOB, id)

    def queued(self, job: Job) -> None:
        """``job`` joined the queue: its backoff's end, and its model wait's."""
        if job.not_before > job.submitted_at:
            heapq.heappush(self._heap, (job.not_before, JOB, job.id))
        if self._model_wait_s is not None and job.model is not None and not job.gang:
            heapq.heappush(self._heap, (job.submitted_at + self._model_wait_s, JOB, job.id))

    def started(self, alloc: Allocation) -> None:
        """``alloc`` holds resources now: when it may first be preempted, if ever."""
        if not self._preemption or not alloc.preemptible:
            return
        pclass = self._classes.get(alloc.priority)
        if pclass is not None and not pclass.preemptible:
            return
        heapq.heappush(self._heap, (alloc.started_at + self._min_runtime_s, ALLOC, alloc.id))

    def wake_at(
        self, now: float, queued: Mapping[str, Job], allocations: Mapping[str, object]
    ) -> float | None:
        """The first instant after ``now`` still pending, or None. ``queued`` and
        ``allocations``: what the scheduler holds now, to drop entries that are gone."""
        heap = self._heap
        while heap:
            when, what, key = heap[0]
            if when > now and (key in allocations if what == ALLOC else key in queued):
                return when
            heapq.heappop(heap)
        return None
