"""Group commit: many concurrent units of work in one transaction, one fsync.

Under load, every single-job submission committing on its own is bounded by
commit latency (an fsync each). ``GroupCommitter.run(unit)`` queues the unit;
one flusher at a time takes everything queued, runs the units one after
another inside one ``Runtime.tx()``, commits once, and only then answers
each caller. A unit that raises gets its exception and the others are
unaffected: the group's transaction is rolled back and the group run again
with each unit in its own savepoint (rolled back, with its events, when the
unit raises). Units rarely raise, so the common case pays for no savepoints
(two statements per unit); a unit must therefore keep its effects in the
transaction (``tx.emit``, ``tx.then``), since it may run twice. If the
commit itself fails, every unit of the group gets that error: nobody is told
"accepted" for work that was not committed.

When requests arrive one at a time, a group is a single unit and nothing
waits: batching happens only when there is a queue to batch. The next group
begins as soon as the last one has committed, not once it is durable: on
SQLite its commit then shares the fsync under way or the next one
(``WalSync``), instead of adding an fsync of its own to every group's wait.

The server has one committer for submissions and agents' allocation updates
(``ControlPlane``): under load, the submissions and the ends that arrive
together are one transaction and one fsync, not one of each. A unit whose
change needs a scheduling cycle (a submission, an end while work waits) sets
``tx.reschedule``; a group pokes the scheduler only when one of its units did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from corral.server.services.unit import Runtime, Tx

T = TypeVar("T")
Unit = Callable[[Tx], Awaitable[Any]]
Queued = tuple[Unit, "asyncio.Future[Any]", bool, bool]  # the unit, its future, durable, early
Outcome = tuple["asyncio.Future[Any]", bool, Any]  # the caller's future, ok, value or error


class GroupCommitter:
    def __init__(self, rt: Runtime, max_group: int = 256) -> None:
        self.rt = rt
        self.max_group = max_group
        self._queue: list[Queued] = []
        self._flusher: asyncio.Task[None] | None = None
        self._syncing: set[asyncio.Task[None]] = set()  # committed groups awaiting the disk
        self.groups = 0  # committed groups (for tests and metrics)

    async def run(
        self, unit: Callable[[Tx], Awaitable[T]], *, durable: bool = True, early: bool = False
    ) -> T:
        """Run ``unit`` in the next group; returns its result once the group has committed.

        A group commits durably (waits for the disk) when any of its units asks to. The
        events of ``early`` units reach readers at its commit (``Runtime.tx``'s ``early``),
        the others' once it is durable.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append((unit, future, durable, early))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        """Group after group, each begun once the one before has committed (or failed)."""
        while self._queue:
            group, self._queue = self._queue[: self.max_group], self._queue[self.max_group :]
            committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._commit(group, committed))
            self._syncing.add(task)
            task.add_done_callback(self._syncing.discard)
            await asyncio.wait((committed, task), return_when=asyncio.FIRST_COMPLETED)

    async def _commit(self, group: list[Queued], committed: asyncio.Future[None]) -> None:
        try:
            try:
                outcomes = await self._run(group, committed, careful=False)
            except _UnitFailed as failed:
                if len(group) == 1:  # nothing else to keep: the unit's error is the outcome
                    outcomes = [(group[0][1], False, failed.error)]
                else:
                    outcomes = await self._run(group, committed, careful=True)
        except BaseException as exc:  # the commit failed: no unit of this group happened
            for _, future, _, _ in group:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            if not isinstance(exc, Exception):
                raise
            return
        self.groups += 1
        for future, ok, value in outcomes:
            if future.done():  # the caller went away (cancelled request)
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    async def _run(
        self, group: list[Queued], committed: asyncio.Future[None], *, careful: bool
    ) -> list[Outcome]:
        """One transaction over ``group``: bare units (raising ``_UnitFailed``), or savepoints;
        ``committed`` is set at its commit, before the wait for the disk.

        The units whose events need not wait for the disk (``early`` ones, and those that
        are not ``durable``: agents' reports) run first, in the order they came, so their
        events take the transaction's first numbers and reach readers at its commit; the
        others' (submissions) follow once it is durable (``Tx.early_events``). An agent's
        start and end keep their order; only units from different sources change places."""
        outcomes: list[Outcome] = []
        durable = any(d for _, _, d, _ in group)
        ordered = sorted(group, key=_held)  # stable: each kind keeps its order

        async def commit_seen() -> None:
            if not committed.done():
                committed.set_result(None)

        async with self.rt.tx(durable=durable) as tx:  # a unit needing a cycle says so
            tx.at_commit(commit_seen)
            for queued in ordered:
                unit, future = queued[0], queued[1]
                if careful:
                    outcomes.append((future, *await _attempt(tx, unit)))
                else:
                    outcomes.append((future, True, await _bare(tx, unit)))
                if not _held(queued):
                    tx.early_events = len(tx.events)
        return outcomes


def _held(queued: Queued) -> bool:
    """Its events wait for the group's fsync: durable, and not ``early``."""
    _, _, durable, early = queued
    return durable and not early


class _UnitFailed(Exception):
    """A unit raised while its group ran without savepoints: run the group carefully."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def _bare(tx: Tx, unit: Unit) -> Any:
    try:
        return await unit(tx)
    except Exception as exc:
        raise _UnitFailed(exc) from exc


async def _attempt(tx: Tx, unit: Unit) -> tuple[bool, Any]:
    """Run one unit in a savepoint; on error roll it (its events and follow-ups too) back."""
    mark = tx.mark()
    savepoint = await tx.conn.begin_nested()
    try:
        value = await unit(tx)
    except Exception as exc:
        await savepoint.rollback()
        tx.undo_since(mark)
        return False, exc
    await savepoint.commit()
    return True, value
