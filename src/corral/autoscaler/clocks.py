"""What a shell remembers between decisions: since when each node is idle, each job waiting.

``autoscale`` is pure, so its hysteresis needs these times as inputs. The
server's loop and the simulator keep one ``Clocks`` each and feed it what they
see at every decision; a clock starts the first time something is seen idle
(or waiting) and stops when it is not, so a new leader or a restart starts
them again: it removes and launches later, never sooner.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from corral.autoscaler.api import Pending
from corral.core.model import Job


class Clocks:
    def __init__(self) -> None:
        self.idle_since: dict[str, float] = {}
        self.waiting_since: dict[str, float] = {}

    def idle(self, names: Iterable[str], busy: Collection[str], now: float) -> dict[str, float]:
        """Since when each of ``names`` that is not ``busy`` has been idle (nodes not named
        any more are forgotten)."""
        before = self.idle_since
        self.idle_since = {n: before.get(n, now) for n in names if n not in busy}
        return dict(self.idle_since)

    def pending(
        self, waiting: Iterable[tuple[Job, frozenset[str]]], now: float
    ) -> tuple[Pending, ...]:
        """``waiting`` (unplaced jobs in queue order, with their reason codes) as ``Pending``,
        each since the first decision that saw it; jobs no longer waiting are forgotten."""
        rows = list(waiting)
        before = self.waiting_since
        self.waiting_since = {job.id: before.get(job.id, now) for job, _ in rows}
        return tuple(Pending(job, self.waiting_since[job.id], codes) for job, codes in rows)

    def forget(self) -> None:
        """Stop every clock (this replica stopped leading)."""
        self.idle_since.clear()
        self.waiting_since.clear()
