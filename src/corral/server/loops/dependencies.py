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
        trigger = self.rt.release_needed
        while True:
            await trigger.wait(POLL_S)
            trigger.clear()  # an end committed during the pass fires it again
            try:
                while await release_waiting(self.rt):
                    pass  # a cancel ends jobs that need it: their dependents go next
            except Exception:  # keep releasing even if one pass fails
                log.exception("the release pass failed")
