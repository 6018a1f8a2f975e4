"""The release loop: waiting jobs enter the queue (or are cancelled) as their
dependencies end (``services/dependencies.py``).

It wakes when a job ends on this replica while jobs wait (``Runtime.release_needed``),
and every ``POLL_S`` for ends committed by other replicas: a pass over no open
dependency is one read of an empty table.
"""

from __future__ import annotations

import logging

from corral.server.services.dependencies import release_waiting
from corral.server.services.unit import Runtime

log = logging.getLogger("corral.server.dependencies")

POLL_S = 2.0
"""The longest a waiting job stays waiting after its last dependency ended on another
replica; on this one, the end pokes the loop at once."""


class ReleaseLoop:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def run(self) -> None:
        trigger, wait_s = self.rt.release_needed, POLL_S
        while True:
            await trigger.wait(wait_s)
            trigger.clear()  # an end committed during the pass fires it again
            try:
                wait_s = await self.drain()
            except Exception:  # keep releasing even if one pass fails
                log.exception("the release pass failed")
                wait_s = POLL_S

    async def drain(self) -> float:
        """Passes until one moves nothing (a cancel ends jobs that need it: their dependents
        go next); how long until the next must run (a hold ends, or ``POLL_S``)."""
        while True:
            moved, hold_end = await release_waiting(self.rt)
            if not moved:
                break
        if hold_end is None:
            return POLL_S
        return min(POLL_S, max(0.0, hold_end - self.rt.clock.now()))
