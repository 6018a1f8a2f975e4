"""The runtime the services share, and the unit of work every change goes through.

``Runtime`` is built once by the composition root (``app.py``). ``Runtime.tx()``
opens one write transaction, collects the events the change produces, appends
them in the same transaction, and after the commit wakes SSE readers and runs
the follow-ups (messages to agents, a scheduling trigger; ``publishing.py``
says when each goes). Nothing is sent over the network inside a transaction.
The group-commit writer (``group.py``) batches several units into one
transaction behind this same interface.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.clock import Clock
from corral.core.events import Event, EventKind
from corral.server.agentlink.base import AgentLink
from corral.server.blobs import BlobStore
from corral.server.policy_doc import Policy
from corral.server.services.metrics import Metrics
from corral.server.services.publishing import InOrder, Publication
from corral.server.services.recent import RecentEvents
from corral.server.services.wakeups import Trigger, Wakeups
from corral.server.settings import Settings
from corral.server.store.db import Database
from corral.server.store.events import TeamEvent
from corral.server.store.records import AllocRecord

PLACED_ALLOCS_MAX = 20_000
"""Allocations kept as placed (``Runtime.placed_allocs``): the most a busy server has
between placing work and hearing of it, many times over."""


@dataclass
class Runtime:
    settings: Settings
    db: Database
    blobs: BlobStore
    clock: Clock
    link: AgentLink
    metrics: Metrics
    # The policy in force here (``services/policy.py`` replaces it with the store's latest)
    # and its version (0: the built-in one, none applied yet).
    policy: Policy
    policy_version: int = 0
    # Price per GPU-hour of each autoscaled node pool (its machine's price over its GPUs):
    # what usage costs where the policy names no price (services/usage.py).
    pool_prices: dict[str, float] = field(default_factory=dict)
    # Each node's pool as last read, and when (services/usage.py): read again after a minute.
    node_pools: dict[str, tuple[str, float]] = field(default_factory=dict)
    wakeups: Wakeups = field(default_factory=Wakeups)  # SSE readers wait on it
    recent: RecentEvents = field(default_factory=RecentEvents)  # what SSE readers read first
    known_teams: set[str] = field(default_factory=set)  # rows known to exist: skip the check
    schedule_needed: Trigger = field(default_factory=Trigger)  # the scheduling loop waits on it
    # Jobs wait for others to end (services/dependencies.py): a job's end then pokes the
    # release pass. True until a pass finds none, so a restart looks once.
    deps_waiting: bool = True
    release_needed: Trigger = field(default_factory=Trigger)  # the release loop waits on it
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
        path to them (docs/performance.md, "End to end"). Follow-ups still wait for the fsync.
        Without it, the first ``tx.early_events`` events go out so (a group's early units';
        the rest follow once durable, and later changes' events after them).
        """
        tx = Tx(self.clock.now())
        change = Publication(self, tx, early=early, reschedule=reschedule)
        try:
            async with self.db.write(durable=durable, on_commit=change.on_commit) as conn:
                tx.conn = conn
                yield tx
                await change.append(conn)
            if change.jump and not durable:
                # The jump reaches readers only from the disk: one a crash could forget would
                # let the next start's jump land on numbers readers have seen.
                await self.db.sync_committed()
            await change.on_durable()
        finally:
            change.close()


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
