"""How a committed change's events reach SSE readers: in commit order, some at the
commit and the rest once durable (``Publication``), and what follows each commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import LinkError
from corral.core.events import TERMINAL_JOB_EVENTS
from corral.server.store import events as event_repo

if TYPE_CHECKING:
    from corral.server.services.unit import Runtime, Tx

log = logging.getLogger("corral.server")


class Turn:
    """One committed change's place in the order its events are published in."""

    def __init__(self, before: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        self._before = before
        self._mine = mine

    @property
    def ready(self) -> bool:
        """Every change committed before this one has published its events."""
        return self._before is None or self._before.done()

    async def wait(self) -> None:
        """Until every change committed before this one has published its events."""
        if self._before is not None and not self._before.done():
            await asyncio.shield(self._before)

    def done(self) -> None:
        """This change is out (or has nothing to publish): later ones may go once earlier
        ones have; a change that did not wait hands its place on when its predecessor goes."""
        if self._before is not None and not self._before.done():
            self._before.add_done_callback(lambda _: self._finish())
        else:
            self._finish()

    def _finish(self) -> None:
        if not self._mine.done():
            self._mine.set_result(None)


class InOrder:
    """Hands out ``Turn``s: a durable change waits for its fsync, and a change committed
    after it must not reach SSE readers first (a reader past its ``seq`` would miss it)."""

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def take(self) -> Turn:
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn, self._last = Turn(self._last, mine), mine
        return turn


class Publication:
    """One change's events on their way to SSE readers, and what follows its commit.

    1. Events reach readers only once committed, and never before those of a change
       committed earlier (``Turn``): a reader past an event's ``seq`` would miss it.
    2. A durable change's events go out once it is durable (after its fsync).
    3. An ``early`` change's events, or its first ``tx.early_events``, go out at its
       commit, before its fsync, when every earlier change's are out already and it
       does not carry the start's jump of event numbers (``Database.event_jump``:
       readers may see that only from the disk).
    4. At the commit: the scheduling loop is poked (when asked) and ``tx.at_once``
       actions run; once durable: ``tx.after_commit`` actions. An action's failure is
       logged, never reported to whoever asked for the change (it happened).
    5. A change that does not commit gives back the event numbers it took.
    """

    def __init__(self, rt: Runtime, tx: Tx, *, early: bool, reschedule: bool) -> None:
        self.rt = rt
        self.tx = tx
        self.early = early
        self.reschedule = reschedule
        self.turn: Turn | None = None
        self.seqs: list[int] = []  # the events' numbers, once appended
        self.published = 0  # how many of the events readers have been given
        self.committed = False
        self.jump = 0  # how far this change's first event jumped (rule 3)

    async def append(self, conn: AsyncConnection) -> None:
        """Append the events, last in the transaction, under the write lock: the lock
        orders commits, so the turn taken here is the commit's place (rule 1)."""
        db = self.rt.db
        self.jump = db.event_jump if self.tx.events else 0
        db.event_jump -= self.jump  # taken (given back by ``close`` if this does not commit)
        self.seqs = await event_repo.append(conn, self.tx.events, jump=self.jump)
        self.turn = self.rt.publishing.take()

    async def on_commit(self) -> None:
        """Right after the commit, before a durable change's fsync: rules 3 and 4."""
        self.committed = True
        tx = self.tx
        if self.reschedule or tx.reschedule:
            self.rt.schedule_needed.fire()
        if self.rt.deps_waiting and any(e.event.kind in TERMINAL_JOB_EVENTS for e in tx.events):
            self.rt.release_needed.fire()  # a job that waits for this one may go now
        upto = len(tx.events) if self.early else tx.early_events
        turn = self.turn
        if upto and not self.jump and turn is not None and turn.ready:
            self.publish(upto)
            if upto == len(tx.events):
                turn.done()
        for action in tx.at_once:  # e.g. assignments: on their way while the disk syncs
            await follow_up(action)

    async def on_durable(self) -> None:
        """Once the change is durable as asked: rules 2 and 4."""
        tx, turn = self.tx, self.turn
        try:
            for action in tx.after_commit:  # e.g. assignments: not held up by others' fsyncs
                await follow_up(action)
        finally:  # committed events are published whatever became of the follow-ups
            if turn is not None and self.published < len(tx.events):
                await turn.wait()  # events committed before these are out first
                self.publish(len(tx.events))

    def publish(self, upto: int) -> None:
        """Give readers the events up to ``upto``."""
        rt, tx, published = self.rt, self.tx, self.published
        batch = tx.events[published:upto]
        rt.recent.add(batch, self.seqs[published:upto])  # before the wake-up: readers find them
        rt.wakeups.publish(batch)
        self.published = upto

    def close(self) -> None:
        """The change is over, committed or not: rule 5, and the next change's turn."""
        if not self.committed:
            self.rt.db.event_jump += self.jump
        if self.turn is not None:
            self.turn.done()


async def follow_up(action: Callable[[], Awaitable[None]]) -> None:
    """Run what follows a commit; its failure is logged, never reported to whoever asked
    for the change (it happened: a client told otherwise would ask again)."""
    try:
        await action()
    except LinkError as exc:
        # The intent is stored; the agent gets it again when it says hello.
        log.info("agent link: %s (will resend on reconnect)", exc)
    except Exception:
        log.exception("an action after a commit failed")
