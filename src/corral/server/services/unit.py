"""The runtime the services share, and the unit of work every change goes through.

``Runtime`` is built once by the composition root (``app.py``). ``Runtime.tx()``
opens one write transaction, collects the events the change produces, appends
them in the same transaction, and after the commit wakes SSE readers and runs
the follow-ups (messages to agents, a scheduling trigger). Nothing is sent
over the network inside a transaction. A later group-commit writer can batch
several units into one transaction behind this same interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.clock import Clock
from corral.core.errors import LinkError
from corral.core.events import Event, EventKind
from corral.core.model import PriorityClass
from corral.server.agentlink.base import AgentLink
from corral.server.blobs import BlobStore
from corral.server.services.metrics import Metrics
from corral.server.services.recent import RecentEvents
from corral.server.settings import Settings
from corral.server.store import events as event_repo
from corral.server.store.db import Database
from corral.server.store.events import TeamEvent
from corral.server.store.records import AllocRecord

PLACED_ALLOCS_MAX = 20_000
"""Allocations kept as placed (``Runtime.placed_allocs``): the most a busy server has
between placing work and hearing of it, many times over."""

log = logging.getLogger("corral.server")


class Wakeup:
    """One reader's wait for the next publication it would read (see ``Wakeups``)."""

    __slots__ = ("job_id", "kinds", "team", "woken")

    def __init__(self, job_id: str | None, kinds: frozenset[str] | None, team: str | None) -> None:
        self.job_id = job_id
        self.kinds = kinds
        self.team = team
        self.woken = asyncio.Event()

    def wants(self, te: TeamEvent) -> bool:
        """Would the all-events stream this waits for send ``te``? (its kinds and team)"""
        kinds = self.kinds
        return (kinds is None or te.event.kind in kinds) and (
            self.team is None or te.team == self.team
        )


class Wakeups:
    """Wake-ups for SSE readers, each by what it reads.

    A reader takes a ``ticket(...)`` *before* reading, then ``wait(ticket)``: a
    publication between the read and the wait is not lost. ``publish(events)``
    wakes only the readers those events concern: a job's stream by that job's
    events (any kind: its end may come under a kind it does not send), the
    all-events stream by an event it would send (its kinds, its team). Every
    commit used to wake every open stream, and a job's stream then read the
    job's row to see whether it had ended: with many clients waiting on their
    jobs (the SDK's ``Job.wait`` follows one stream per job), each commit cost a
    read per waiting client (docs/performance.md, item 53).
    """

    def __init__(self) -> None:
        self._by_job: dict[str, list[Wakeup]] = {}
        self._others: set[Wakeup] = set()

    def ticket(
        self,
        *,
        job_id: str | None = None,
        kinds: frozenset[str] | None = None,
        team: str | None = None,
    ) -> Wakeup:
        """Register a wait for ``job_id``'s events (of any kind and team: a job's stream
        wakes for all of them), or, without a job, for events of ``kinds`` (None: any)
        readable by ``team`` (None: an admin, every team's)."""
        ticket = Wakeup(job_id, kinds, team)
        if job_id is not None:
            self._by_job.setdefault(job_id, []).append(ticket)
        else:
            self._others.add(ticket)
        return ticket

    def publish(self, events: Sequence[TeamEvent]) -> None:
        """Wake the readers ``events`` (just made readable) concern."""
        by_job = self._by_job
        if by_job:
            for te in events:
                job_id = te.event.job_id
                if job_id is not None and job_id in by_job:
                    for ticket in by_job.pop(job_id):
                        ticket.woken.set()
        if self._others:
            woken = [t for t in self._others if any(t.wants(te) for te in events)]
            for ticket in woken:
                self._others.discard(ticket)
                ticket.woken.set()

    async def wait(self, ticket: Wakeup, timeout: float) -> bool:
        """True when woken since ``ticket`` was taken, False when ``timeout`` passed first."""
        try:
            if ticket.woken.is_set():
                return True
            # asyncio.timeout, not wait_for: no task per wait, and on 3.11 wait_for loses a
            # cancel that races the wake-up (the waiter then never stops; docs/agent-link.md).
            async with asyncio.timeout(timeout):
                await ticket.woken.wait()
        except TimeoutError:
            return False
        finally:
            self.forget(ticket)
        return True

    def forget(self, ticket: Wakeup) -> None:
        """Drop ``ticket`` unwaited (the reader stops, or reads again at once). Idempotent."""
        if ticket.woken.is_set():
            return  # publish took it out already, or it was forgotten
        ticket.woken.set()
        if ticket.job_id is None:
            self._others.discard(ticket)
            return
        tickets = self._by_job.get(ticket.job_id)
        if tickets is not None:
            tickets.remove(ticket)
            if not tickets:
                del self._by_job[ticket.job_id]

    @property
    def waiting(self) -> int:
        """Readers registered now (for tests)."""
        return len(self._others) + sum(len(t) for t in self._by_job.values())


class Trigger:
    """A level-triggered wake-up for one loop: a poke during a cycle is never lost."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    @property
    def fired(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float) -> bool:
        """True when poked, False when ``timeout`` passed first. Does not clear."""
        if self._event.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):  # see Wakeups.wait
                await self._event.wait()
        except TimeoutError:
            return False
        return True


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


@dataclass
class Runtime:
    settings: Settings
    db: Database
    blobs: BlobStore
    clock: Clock
    link: AgentLink
    metrics: Metrics
    priority_classes: tuple[PriorityClass, ...]
    wakeups: Wakeups = field(default_factory=Wakeups)  # SSE readers wait on it
    recent: RecentEvents = field(default_factory=RecentEvents)  # what SSE readers read first
    known_teams: set[str] = field(default_factory=set)  # rows known to exist: skip the check
    schedule_needed: Trigger = field(default_factory=Trigger)  # the scheduling loop waits on it
    # Work the scheduling loop could not place yet (or victims it awaits, or a backoff timer).
    # Only the leading loop ever clears it, after a cycle that left nothing waiting: an
    # allocation's end then needs no cycle of its own (see ``settling.end_allocation``).
    work_waiting: bool = True
    publishing: InOrder = field(default_factory=lambda: InOrder())  # events out in commit order
    # Allocations as placed, until an agent's report reads each back (``AgentService._fenced``:
    # the row's version alone is read, and the record taken when it is still this one's).
    # The oldest go first past ``PLACED_ALLOCS_MAX`` (allocations no report ever names).
    placed_allocs: dict[str, AllocRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Other replicas commit events too on PostgreSQL: memory serves only gapless runs.
        self.recent.contiguous = self.db.is_postgres

    def placed(self, recs: Sequence[AllocRecord]) -> None:
        """Note allocations just inserted: the first agent's report of each takes its record
        (``placed_allocs``). Only a hint: a version read decides, so a placement rolled
        back leaves none wrong."""
        kept = self.placed_allocs
        for r in recs:
            kept[r.alloc.id] = r
        while len(kept) > PLACED_ALLOCS_MAX:
            del kept[next(iter(kept))]  # the oldest: insertion order

    @contextlib.asynccontextmanager
    async def tx(
        self, *, reschedule: bool = False, durable: bool = True, early: bool = False
    ) -> AsyncIterator[Tx]:
        """One unit of work. ``reschedule`` pokes the scheduling loop after the commit.

        ``durable=False``: no promise rests on this change alone (see ``Database.write``).
        The scheduling loop is poked as soon as the change committed (before a durable
        one's fsync), and ``Tx.at_commit`` actions run then too; follow-ups run once it
        is durable as asked; its events reach SSE readers after that, in commit order
        (after the fsyncs of earlier durable changes).

        ``early=True``: the change's events may reach readers at its commit, before its
        fsync, when every change committed before it is out already (not the change that
        takes the start's jump of event numbers: that one's events wait for the disk, as
        do a relaxed change's then). For a change whose
        source keeps it until told it is durable and sends it again otherwise (an agent's
        report, kept in its outbox until the follow-up acknowledges it): readers then see
        what they could already read from the committed rows, and the fsync is off the
        path to them (docs/performance.md, item 70). Follow-ups still wait for the fsync.
        Without it, the first ``tx.early_events`` events go out so (a group's early units';
        the rest follow once durable, and later changes' events after them).
        """
        tx = Tx(self.clock.now())
        turn: Turn | None = None
        seqs: list[int] = []
        published = 0  # how many of the events readers have been given
        done = False  # committed
        jump = 0  # how far this change's first event jumped (``Database.event_jump``)

        def publish(upto: int) -> None:
            nonlocal published
            batch = tx.events[published:upto]
            self.recent.add(batch, seqs[published:upto])  # before the wake-up: readers find them
            self.wakeups.publish(batch)
            published = upto

        async def committed() -> None:
            nonlocal done
            done = True
            if reschedule or tx.reschedule:
                self.schedule_needed.fire()
            upto = len(tx.events) if early else tx.early_events
            if upto and not jump and turn is not None and turn.ready:
                publish(upto)
                if upto == len(tx.events):
                    turn.done()
            await self._run_at_once(tx)

        try:
            async with self.db.write(durable=durable, on_commit=committed) as conn:
                tx.conn = conn
                yield tx
                jump = self.db.event_jump if tx.events else 0  # read under the write lock
                self.db.event_jump -= jump  # taken (given back below if this does not commit)
                seqs = await event_repo.append(conn, tx.events, jump=jump)
                turn = self.publishing.take()  # under the write lock: commit order
            if jump and not durable:
                # The jump reaches readers only from the disk: one a crash could forget would
                # let the next start's jump land on numbers readers have seen.
                await self.db.sync_committed()
            try:
                for action in tx.after_commit:  # e.g. assignments: not held up by others' fsyncs
                    await self._run_follow_up(action)
            finally:  # committed events are published whatever became of the follow-ups
                if published < len(tx.events):
                    await turn.wait()  # events committed before these are out first
                    publish(len(tx.events))
        finally:
            if not done:
                self.db.event_jump += jump
            if turn is not None:
                turn.done()

    async def _run_at_once(self, tx: Tx) -> None:
        for action in tx.at_once:  # e.g. assignments: on their way while the disk syncs
            await self._run_follow_up(action)

    async def _run_follow_up(self, action: Callable[[], Awaitable[None]]) -> None:
        """Run what follows a commit; its failure is logged, never reported to whoever
        asked for the change (it happened: a client told otherwise would ask again)."""
        try:
            await action()
        except LinkError as exc:
            # The intent is stored; the agent gets it again when it says hello.
            log.info("agent link: %s (will resend on reconnect)", exc)
        except Exception:
            log.exception("an action after a commit failed")


@dataclass
class Tx:
    """What one unit of work collects while its transaction is open."""

    now: float
    conn: AsyncConnection = field(init=False)
    events: list[TeamEvent] = field(default_factory=list)
    after_commit: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    at_once: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    reschedule: bool = False
    # The first this many events may reach readers at the commit, before its fsync, as all
    # of them do with ``Runtime.tx(early=True)``: a group's early units' (``GroupCommitter``).
    early_events: int = 0

    def emit(
        self,
        kind: EventKind,
        *,
        team: str | None,
        job_id: str | None = None,
        node: str | None = None,
        data: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """Record an event (appended in this transaction); ``data`` and ``fields`` are its data."""
        payload = {**(data or {}), **fields}
        self.events.append(TeamEvent(Event(kind, self.now, job_id, node, payload), team))

    def then(self, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` after the commit (never inside the transaction)."""
        self.after_commit.append(action)

    def at_commit(self, action: Callable[[], Awaitable[None]]) -> None:
        """Run ``action`` right after the commit, before a durable one's fsync ends: for
        what no promise rests on (a placement's assignment: reconciliation recovers it)."""
        self.at_once.append(action)

    def mark(self) -> tuple[int, int, int]:
        """Where this transaction's events and actions stand now (for ``undo_since``)."""
        return len(self.events), len(self.after_commit), len(self.at_once)

    def undo_since(self, mark: tuple[int, int, int]) -> None:
        """Forget the events and actions collected since ``mark`` (their rows were rolled
        back to a savepoint)."""
        del self.events[mark[0] :]
        del self.after_commit[mark[1] :]
        del self.at_once[mark[2] :]

    def count(self, effect: Callable[[], None]) -> None:
        """Run ``effect`` (a metric) once the change committed: a unit of a group may run twice."""

        async def run() -> None:
            effect()

        self.after_commit.append(run)
