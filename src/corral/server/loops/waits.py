"""The queue's order, reasons and ETAs on every replica, not only the scheduling leader.

The leader keeps them in memory (``SchedulingLoop.unplaced``, ``EtaKeeper``); with
PostgreSQL, other replicas answer ``GET /v1/queue``, ``/v1/jobs`` and
``/v1/jobs/{id}`` too, and must say what the leader would. So the leader writes
them to ``queue_waits`` every ``PUBLISH_S`` when they changed (the rows replaced
whole, at most ``MAX_ROWS``, first in the queue's order), and a
follower reads them back at most once every ``READ_S``. A follower's answer is
then at most a few seconds older than the leader's: reasons and ETAs change at
that pace anyway, and a job's state, read from its own row, is always current.
On SQLite there is one replica, which reads its own memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final

from corral.scheduler.api import Unplaced
from corral.server.loops.etas import EtaKeeper
from corral.server.services.unit import Runtime
from corral.server.store import waits as store
from corral.server.store.waits import Said

log = logging.getLogger("corral.server.waits")

PUBLISH_S: Final = 2.0  # the leader writes what it said this often while work waits or runs
READ_S: Final = 1.0  # a follower reads it back at most this often
MAX_ROWS: Final = 10_000  # queued jobs published, first in the order: a page shows 1,000


class WaitBoard:
    """What the leader last said of waiting and running jobs, on whichever replica asks."""

    def __init__(
        self,
        rt: Runtime,
        leading: Callable[[], bool],
        unplaced: Callable[[], Mapping[str, Unplaced]],
        etas: EtaKeeper,
    ) -> None:
        self.rt = rt
        self.leading = leading
        self.unplaced = unplaced
        self.etas = etas
        self._read: Said | None = None
        self._read_at = float("-inf")
        self._published: list[store.Row] | None = None  # as last written (None: not yet)

    async def said(self) -> Said:
        """The leader's unplaced jobs and ETAs: this replica's own when it leads (or is the
        only one), else as the leader last published them."""
        if not self.rt.db.is_postgres or self.leading():
            return Said(self.unplaced(), self.etas.etas, self.etas.made_at)
        now = self.rt.clock.now()
        if self._read is None or now - self._read_at >= READ_S:
            async with self.rt.db.read() as conn:
                self._read = await store.read(conn)
            self._read_at = now
        return self._read

    async def reasons(self) -> Mapping[str, Unplaced]:
        """The unplaced jobs alone (``QueueService``'s order and reasons)."""
        return (await self.said()).unplaced

    async def publish(self) -> int:
        """Write what this replica said, if it leads and it changed since it last wrote;
        the number of rows written."""
        if not self.leading():
            self._published = None  # another leader may write meanwhile
            return 0
        unplaced = sorted(self.unplaced().values(), key=lambda u: u.position)[:MAX_ROWS]
        made_at = max(self.etas.made_at, 0.0)  # -inf: no ETA made yet
        rows = store.rows(unplaced, self.etas.etas, made_at)
        if rows == self._published:
            return 0  # unchanged: a queue that stands still is not written again and again
        async with self.rt.db.write(ordered_events=False, durable=False) as conn:
            await store.replace(conn, rows)
        self._published = rows
        return len(rows)

    async def run(self) -> None:
        """Publish every ``PUBLISH_S`` (PostgreSQL only: SQLite has no other replica)."""
        if not self.rt.db.is_postgres:
            return
        while True:
            await asyncio.sleep(PUBLISH_S)
            try:
                await self.publish()
            except Exception:  # a failed write is tried again at the next turn
                log.exception("publishing the queue's reasons and ETAs failed")
