"""A gang replica launches on the server's go, not as soon as it is prepared.

The server says go once every replica of the gang has reported ``Ready``
(``server/services/gang_start.py``): models in place, checkpoint and input
files fetched. Until then a rank would sit in its rendezvous while another
node is still downloading. A stop (the gang was preempted, a replica failed)
ends the wait without launching anything. A server that does not send go
(its Welcome does not say ``gang_go``) gets replicas that start at once.

Getting the executor ready (``warm``: a zygote that has imported torch) is part of
preparing, so it comes before ``Ready``: the time from go to the ranks' rendezvous
is then the fork's, not the imports'. A warm-up that fails only means a cold start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from corral.agent.executors.base import StopRequest, StopSignal

log = logging.getLogger("corral.agent")


class GangGate:
    def __init__(self) -> None:
        self.enabled = False  # the server's Welcome says it answers Ready with go
        self._waiting: dict[str, asyncio.Future[None]] = {}

    def go(self, allocation_id: str) -> None:
        """The server's go: launch the replica waiting in ``allocation_id`` (if one is)."""
        waiting = self._waiting.get(allocation_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def ready(
        self,
        allocation_id: str,
        stop: StopSignal,
        say_ready: Callable[[], None],
        warm: Awaitable[None] | None = None,
    ) -> StopRequest | None:
        """Finish ``warm``, say ready and wait for the go; the stop request instead if a stop
        came first."""
        if warm is not None and await _warmed(warm, stop) is not None:
            return stop.requested
        go = self._waiting[allocation_id] = asyncio.get_running_loop().create_future()
        say_ready()
        try:
            await asyncio.wait((go, stop.future()), return_when=asyncio.FIRST_COMPLETED)
        finally:
            del self._waiting[allocation_id]
        return stop.requested


async def _warmed(warm: Awaitable[None], stop: StopSignal) -> StopRequest | None:
    """Wait for ``warm`` (its failure logged: the run starts cold); the stop request if a
    stop came first."""
    task = asyncio.ensure_future(warm)
    try:
        await asyncio.wait((task, stop.future()), return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()  # nothing if it is done
    error = task.exception() if task.done() and not task.cancelled() else None
    if error is not None:
        log.warning("getting ready for a gang replica failed (it starts cold): %r", error)
    return stop.requested
