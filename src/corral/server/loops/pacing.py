"""When the scheduling loop may run its next cycle, and whether that cycle explains.

1. Never cycle back to back: cycles start at least the last one's length
   apart, so scheduling takes at most about half of the process while
   submissions pour in.
2. While work arrives in bursts (the last cycle found more than one job
   waiting), cycles start at least ``debounce_s`` apart, so a burst gathers
   into one cycle; a job arriving at a quiet server is scheduled at once.
3. Up to ``EXPLAIN_ALWAYS`` queued jobs every cycle works out why each job
   it leaves waits. Past it, at most every ``explain_interval_s``, stretched
   so that explaining stays under ``EXPLAIN_SHARE`` of the time: explaining
   40,000 waiting jobs took half of what a cycle cost, every cycle. The
   cycles between place only (the same placements).
"""

from __future__ import annotations

import time

from corral.server.settings import SchedulingSettings

EXPLAIN_ALWAYS = 256
"""Queued jobs up to which every cycle explains (rule 3)."""

EXPLAIN_SHARE = 0.05
"""The most of the scheduling time that explaining a long queue may take (rule 3)."""


class Pacing:
    """The last cycles' timings, and the rules above applied to them."""

    def __init__(self, settings: SchedulingSettings) -> None:
        self.settings = settings
        self.last_cycle_s = 0.0
        self._cycle_ended = float("-inf")  # perf_counter() when the last cycle ended
        self._burst = False  # the last cycle found more than one job waiting
        self._explained_at = float("-inf")  # clock time of the last cycle that explained
        self._explain_took = 0.0  # how long that cycle took (s)

    def pause_s(self) -> float:
        """How long until the next cycle may start (0 or less: now); rules 1 and 2."""
        debounce = self.settings.debounce_s if self._burst else 0.0
        spacing = max(debounce, self.last_cycle_s)
        return spacing - (time.perf_counter() - self._cycle_ended)

    def explain_due(self, queued: int, now: float) -> bool:
        """Does a cycle over ``queued`` jobs at ``now`` explain? Rule 3."""
        interval = self.settings.explain_interval_s
        if queued <= EXPLAIN_ALWAYS or interval == 0:
            return True
        return now - self._explained_at >= self.explain_every

    @property
    def explain_every(self) -> float:
        """Seconds between explaining cycles on a long queue (rule 3)."""
        return max(self.settings.explain_interval_s, self._explain_took / EXPLAIN_SHARE)

    def ended(self, started: float, queued: int, explained: bool, now: float) -> None:
        """A cycle begun at ``started`` (``perf_counter``) over ``queued`` jobs has ended."""
        self._cycle_ended = time.perf_counter()
        self.last_cycle_s = self._cycle_ended - started
        self._burst = queued > 1
        if explained:
            self._explained_at = now
            self._explain_took = self.last_cycle_s
