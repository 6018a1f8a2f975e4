"""Reading the event table: SSE streams (resumable by ``seq``), the queue view, trace export.

Streams read the table a page at a time, holding a database connection only
while a page is read (never while it is sent), and at most
``limits.stream_table_readers`` of them at once (never more than half the
pool): many streams replaying history wait their turn instead of taking every
connection from requests, ``/healthz`` and agents (docs/security/limits.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import NotFound
from corral.core.events import TERMINAL_JOB_EVENTS, Event
from corral.core.resources import GIB, MILLI
from corral.core.states import JOB, JobState
from corral.scheduler.api import Unplaced
from corral.server.services.auth import Principal
from corral.server.services.unit import Runtime
from corral.server.services.wakeups import Wakeup
from corral.server.store import events as event_repo
from corral.server.store import jobs as job_repo
from corral.server.store.records import JobRecord

PAGE = 500


async def one_by_one(
    batches: AsyncIterator[list[Event] | None],
) -> AsyncIterator[Event | None]:
    """``EventFeed.follow``'s lists, one event at a time (``None`` still means "idle")."""
    async for batch in batches:
        if batch is None:
            yield None
            continue
        for event in batch:
            yield event


class EventFeed:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        settings = rt.settings
        readers = min(settings.limits.stream_table_readers, max(1, settings.store.pool_size // 2))
        self._readers = asyncio.Semaphore(readers)

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one of a stream's reads, once fewer than the readers' bound read."""
        async with self._readers, self.rt.db.read() as conn:
            yield conn

    async def head(self) -> int:
        """The newest event's ``seq``: where a stream of only new events starts."""
        async with self._read() as conn:
            return await event_repo.last_seq(conn)

    async def follow(
        self,
        who: Principal,
        after: int,
        *,
        job_id: str | None = None,
        kinds: frozenset[str] | None = None,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> AsyncIterator[list[Event] | None]:
        """Events after ``after``, then new ones as they commit, in lists of what was read
        together (an SSE stream writes each list at once). ``None`` means "idle a while".

        ``kinds``, when given, keeps only events of those kinds (the others are
        read past, never sent: a client that waits for starts and ends does not
        pay for every progress line).

        A job's stream ends after the job's terminal event (or at once, when
        resuming past it); the all-events stream runs until the client leaves
        (``disconnected`` says so, or the caller stops iterating).
        """
        who.require_client()
        team = None if who.is_admin else who.team
        if job_id is not None:
            await self._visible_job(who, job_id)
        last = after
        wakeups = self.rt.wakeups
        api = self.rt.settings.api
        idle = 0.0
        sent = False  # an event went out since the last wait (else count toward a keep-alive)
        end_pending = False  # the job ended, its last event not yet published (its fsync)
        ticket: Wakeup | None = None
        try:
            while disconnected is None or not await disconnected():
                ticket = wakeups.ticket(job_id=job_id, kinds=kinds, team=team)
                # Read the job's state before its events: both commit together, so an
                # ended job's terminal event is in (or before) the batch read next.
                ended = job_id is not None and await self._ended(job_id)
                batch = self.rt.recent.after(last, job_id=job_id, team=team, limit=PAGE)
                if end_pending and not _has_end(batch):  # waited once for it: read the table
                    batch = None
                elif ended and batch is not None:
                    # A durable change is readable in the table before its events are published
                    # (they wait for its fsync): wait for the publication rather than end early.
                    end_pending = not _has_end(batch)
                    ended = not end_pending
                if batch is None:  # behind the events kept in memory (or PostgreSQL): the table
                    async with self._read() as conn:
                        batch = await event_repo.after(
                            conn, last, job_id=job_id, team=team, limit=PAGE
                        )
                out, last, final = _pick(batch, last, kinds, job_id is not None)
                if out:
                    sent = True
                    yield out
                if final:
                    return
                if len(batch) == PAGE:
                    wakeups.forget(ticket)  # more to read at once
                    continue
                if ended:
                    return
                fired = await wakeups.wait(ticket, api.sse_poll_s)
                idle = 0.0 if fired or sent else idle + api.sse_poll_s
                sent = False
                if idle >= api.sse_keepalive_s:
                    idle = 0.0
                    yield None
        finally:
            if ticket is not None:  # the reader stopped (or went away) between waits
                wakeups.forget(ticket)

    async def _visible_job(self, who: Principal, job_id: str) -> JobRecord:
        async with self._read() as conn:
            rec = await job_repo.get(conn, job_id)
        if rec is None or not who.sees(rec.job.team):
            raise NotFound(f"job {job_id} not found")
        return rec

    async def _ended(self, job_id: str) -> bool:
        async with self._read() as conn:
            rec = await job_repo.get(conn, job_id)
        return rec is None or rec.state in JOB.terminal

    async def export(
        self, who: Principal, after: int = 0
    ) -> AsyncIterator[tuple[Event, str | None]]:
        """Every event after ``after`` in order, with its team: a trace for ``corral sim``."""
        who.require_admin("export the event trace")
        last = after
        while True:
            async with self._read() as conn:
                batch = await event_repo.after(conn, last, limit=PAGE)
            for event, team in batch:
                last = event.seq
                yield event, team
            if len(batch) < PAGE:
                return

    async def sim_trace(self, who: Principal) -> AsyncIterator[dict[str, Any]]:
        """Every job, in submission order, as a trace ``corral sim`` replays (docs/sim.md)."""
        who.require_admin("export the trace")
        last, origin = 0, None
        while True:
            async with self._read() as conn:
                batch = await job_repo.after_seq(conn, last, PAGE)
            for rec in batch:
                last = rec.seq
                origin = rec.job.submitted_at if origin is None else origin
                yield sim_record(rec, origin)
            if len(batch) < PAGE:
                return


def _pick(
    batch: Sequence[tuple[Event, str | None]],
    last: int,
    kinds: frozenset[str] | None,
    one_job: bool,
) -> tuple[list[Event], int, bool]:
    """The events of ``batch`` to send, the seq read up to, and whether the job's final event
    was among them (one job's stream ends with it)."""
    out: list[Event] = []
    for event, _team in batch:
        last = event.seq
        if kinds is None or event.kind in kinds:
            out.append(event)
        if one_job and event.kind in TERMINAL_JOB_EVENTS:
            return out, last, True
    return out, last, False


def _has_end(batch: list[tuple[Event, str | None]] | None) -> bool:
    return batch is not None and any(e.kind in TERMINAL_JOB_EVENTS for e, _ in batch)


def sim_record(rec: JobRecord, origin: float) -> dict[str, Any]:
    """One job as a ``corral sim`` trace row (its JOB_FIELDS); ``origin`` becomes time 0."""
    job, res = rec.job, rec.job.resources
    row: dict[str, Any] = {
        "id": job.id,
        "submit_at": round(job.submitted_at - origin, 6),
        "gpus": res.gpus if res.gpus else res.gpu_milli / MILLI,
        "cpus": res.cpus,
    }
    if rec.started_at is not None and rec.finished_at is not None:
        row["duration"] = round(max(0.0, rec.finished_at - rec.started_at), 6)
    if res.vram_bytes:
        row["vram_gib"] = res.vram_bytes / GIB
    if res.memory_bytes:
        row["memory"] = res.memory_bytes
    if res.gpu_models:
        row["gpu_models"] = sorted(res.gpu_models)
    row.update(team=job.team, user=job.user, priority=job.priority)
    row.update(preemptible=job.preemptible, replicas=job.replicas)
    return row


@dataclass(frozen=True, slots=True)
class QueueEntry:
    job: JobRecord
    position: int
    unplaced: Unplaced | None  # None: not considered by a cycle yet


class QueueService:
    """Queued jobs in the scheduler's order, with its reasons."""

    def __init__(
        self, rt: Runtime, reasons: Callable[[], Awaitable[Mapping[str, Unplaced]]]
    ) -> None:
        self.rt = rt
        self.reasons = reasons

    async def queue(self, who: Principal, limit: int) -> tuple[list[QueueEntry], int]:
        """The first ``limit`` visible entries, and how many jobs are queued in all (visible).

        Ranked from a narrow read of every queued job (id, team) and the last cycle's
        reasons; only the ``limit`` rows shown are read whole."""
        who.require_client()
        async with self.rt.db.read() as conn:
            queued = await job_repo.queued_teams(conn)
            unplaced = await self.reasons()
            fallback = len(unplaced)

            def order(seq: int) -> tuple[int, int]:
                u = unplaced.get(queued[seq][0])
                return (u.position, 0) if u else (fallback, seq)

            ranked = sorted(range(len(queued)), key=order)
            visible = [
                (pos, queued[seq][0]) for pos, seq in enumerate(ranked) if who.sees(queued[seq][1])
            ]
            shown = visible[:limit]
            records = await job_repo.get_many(conn, [job_id for _, job_id in shown])
        entries = [
            QueueEntry(rec, pos, unplaced.get(job_id))
            for pos, job_id in shown
            if (rec := records.get(job_id)) is not None and rec.job.state is JobState.QUEUED
        ]
        return entries, len(visible)
