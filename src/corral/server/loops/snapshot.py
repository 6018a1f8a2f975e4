"""The scheduling leader's derived, in-memory snapshot (DESIGN.md section 2).

The store stays the source of truth. Each cycle asks it only for the
``(id, version)`` of queued jobs, active allocations and nodes, and the teams
(narrow, index-backed reads; one round trip on PostgreSQL: ``store/versions.py``),
and re-reads full rows only for what is new or whose version moved. A cycle
over 10,000 queued jobs therefore decodes a handful of rows instead of 10,000.
Because every write bumps ``version`` (guarded updates), nothing can be missed;
heartbeats (``last_seen``) do not bump it, and the scheduler does not need them.
On SQLite the queued jobs' versions come from the queue's changes since the last
cycle instead (``queue_view.py``), so a deep queue costs what changed; and each
snapshot says how its queued jobs differ from the last one's (``delta``), so the
kept scheduler does not compare them all either.

``rebuild`` drops everything (start, change of leader); ``load`` is the
incremental read. The queued jobs' full records are kept too: the placement
transaction writes from them (guarded by the version the snapshot saw)
instead of reading every placed job again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from operator import attrgetter
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Allocation, Job, Node
from corral.scheduler.api import QueueDelta, Snapshot
from corral.server.loops.queue_view import QueueView
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store import versions
from corral.server.store.records import AllocRecord, JobRecord
from corral.server.store.sql import sqlite_connection

CHUNK = 500  # ids per IN (...) query: far below SQLite's bound-parameter limit
_JOB = attrgetter("job")

T = TypeVar("T")


class SnapshotCache:
    """Queued jobs, active allocations and nodes as of the last ``load``, with their versions."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}  # queued jobs' records, at ``queue``'s versions
        self.queue = QueueView()  # which jobs are queued, at which version, in which order
        self._missing: set[str] = set()  # queued, with no record read at that version yet
        self._follow: bool | None = None  # SQLite with migration 0006's triggers (None: ask)
        self._queued: tuple[Job, ...] | None = None  # the last snapshot's queued jobs
        self.delta: QueueDelta | None = None  # how the last snapshot's differ from the one before
        self.allocations: dict[str, tuple[int, Allocation]] = {}
        self.expected_ends: dict[str, float] = {}
        self.nodes: dict[str, tuple[int, Node]] = {}
        self.rows_read = 0  # full rows decoded by the last load (for tests and metrics)

    def rebuild(self) -> None:
        self.jobs.clear()
        self.queue = QueueView()
        self._missing.clear()
        self._queued = self.delta = None
        self.allocations.clear()
        self.expected_ends.clear()
        self.nodes.clear()

    async def load(
        self,
        conn: AsyncConnection,
        fresh: dict[str, JobRecord] | None = None,
        fresh_allocs: dict[str, AllocRecord] | None = None,
        *,
        advance: bool = True,
    ) -> tuple[Snapshot, dict[str, JobRecord]]:
        """The current snapshot and the queued jobs' records it saw (their versions with them).

        ``fresh`` / ``fresh_allocs``: records the server just inserted
        (``Runtime.fresh_jobs`` / ``fresh_allocs``); one whose version the version read
        confirms is taken instead of reading its row again. Both mappings are emptied.
        ``advance=False``: a read inside a transaction that may still roll back; the next
        load reads the queue's changes seen here again, unless ``self.queue.confirm`` is
        told that transaction committed (``QueueView.follow``).
        """
        self.rows_read = 0
        db = sqlite_connection(conn)
        if self._follow is None and db is not None:
            self._follow = job_repo.follows_queue_changes(db)
        if db is not None and self._follow:
            changed = self.queue.follow(db, advance=advance)
            seen = await versions.read(conn, with_queued=False)
        else:
            seen = await versions.read(conn)
            changed = self.queue.replace(seen.queued)
        dropped, loaded = await self._refresh_jobs(conn, changed, fresh or {})
        if fresh:
            fresh.clear()
        await self._refresh_allocations(conn, seen.active, fresh_allocs or {})
        if fresh_allocs:
            fresh_allocs.clear()
        await self._refresh_nodes(conn, seen.nodes)
        # In submission order; a job whose row moved on since is left for the next cycle.
        # Built by C-level iteration: this runs over every queued job, every cycle.
        in_order = filter(None, map(self.jobs.get, self.queue.order))
        queued = tuple(map(_JOB, in_order))
        self.delta = _delta(self._queued, queued, dropped, loaded)
        self._queued = queued
        snapshot = Snapshot(
            nodes=tuple(n for _, n in self.nodes.values()),
            queued=queued,
            allocations=tuple(a for _, a in self.allocations.values()),
            teams=tuple(seen.teams),
            expected_ends=self.expected_ends,
        )
        return snapshot, self.jobs  # as read; valid until the next load

    async def _refresh_jobs(
        self, conn: AsyncConnection, changed: dict[str, int | None], fresh: dict[str, JobRecord]
    ) -> tuple[list[str], list[str]]:
        """Drop the records of jobs that ``changed`` (and left the queue or moved on), then
        read the missing ones: only the difference is walked, never the whole queue.
        Returns the ids of the records dropped and of those put in."""
        jobs, missing, held = self.jobs, self._missing, self.queue.versions
        dropped: list[str] = []
        for job_id, version in changed.items():
            rec = jobs.get(job_id)
            if rec is not None and rec.version != version:
                del jobs[job_id]
                dropped.append(job_id)
            if version is None:
                missing.discard(job_id)
            elif job_id not in jobs:
                missing.add(job_id)
        stale = []
        loaded: list[str] = []
        for job_id in missing:
            rec = fresh.get(job_id)
            if rec is not None and rec.version == held[job_id]:
                jobs[job_id] = rec
                loaded.append(job_id)
            else:
                stale.append(job_id)

        async def fetch(ids: list[str]) -> list[JobRecord]:
            return list((await job_repo.get_many(conn, ids)).values())

        for rec in await _chunked(stale, fetch):
            if held.get(rec.job.id) == rec.version:  # else it moved on since: next cycle
                jobs[rec.job.id] = rec
                loaded.append(rec.job.id)
        self._missing = {job_id for job_id in missing if job_id not in jobs}
        self.rows_read += len(stale)
        return dropped, loaded

    async def _refresh_allocations(
        self, conn: AsyncConnection, wanted: dict[str, int], fresh: dict[str, AllocRecord]
    ) -> None:
        self.allocations = {k: v for k, v in self.allocations.items() if wanted.get(k) == v[0]}
        stale = []
        for alloc_id, version in wanted.items():
            if alloc_id in self.allocations:
                continue
            hint = fresh.get(alloc_id)
            if hint is not None and hint.version == version and hint.expected_end_at is None:
                self.allocations[alloc_id] = (version, hint.alloc)  # placed: no end expected yet
            else:
                stale.append(alloc_id)

        async def fetch(ids: list[str]) -> list[AllocRecord]:
            return await alloc_repo.get_many(conn, ids)

        for rec in await _chunked(stale, fetch):
            if rec.alloc.active:
                self.allocations[rec.alloc.id] = (rec.version, rec.alloc)
                if rec.expected_end_at is not None:
                    self.expected_ends[rec.alloc.id] = rec.expected_end_at
        self.expected_ends = {k: v for k, v in self.expected_ends.items() if k in self.allocations}
        self.rows_read += len(stale)

    async def _refresh_nodes(self, conn: AsyncConnection, wanted: dict[str, int]) -> None:
        self.nodes = {k: v for k, v in self.nodes.items() if wanted.get(k) == v[0]}
        stale = [n for n in wanted if n not in self.nodes]

        async def fetch(names: list[str]) -> list[tuple[str, int, Node]]:
            return [(r.node.name, r.version, r.node) for r in await node_repo.get_many(conn, names)]

        for key, version, node in await _chunked(stale, fetch):
            self.nodes[key] = (version, node)
        self.rows_read += len(stale)


def _delta(
    base: tuple[Job, ...] | None, queued: tuple[Job, ...], dropped: list[str], loaded: list[str]
) -> QueueDelta | None:
    """How ``queued`` differs from ``base``, when the jobs put in are the ones ending it (the
    usual case: new submissions); else None (the scheduler compares the whole queue)."""
    if base is None:
        return None
    tail = queued[len(queued) - len(loaded) :] if loaded else ()
    if {job.id for job in tail} != set(loaded):
        return None
    return QueueDelta(base, tuple(dropped), tail)


async def _chunked(
    keys: Sequence[str], fetch: Callable[[list[str]], Awaitable[list[T]]]
) -> list[T]:
    out: list[T] = []
    for i in range(0, len(keys), CHUNK):
        out.extend(await fetch(list(keys[i : i + CHUNK])))
    return out
