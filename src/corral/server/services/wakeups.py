"""Wake-ups: SSE readers wait for what they would read, the scheduling loop for a poke."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from corral.server.store.events import TeamEvent


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
    read per waiting client (docs/performance.md, "End to end").
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
