"""The scheduling leader's derived, in-memory snapshot (DESIGN.md section 2).

The store stays the source of truth. Each cycle asks it only for the
``(id, version)`` of queued jobs, active allocations and nodes, and the teams
(narrow, index-backed reads; one round trip on PostgreSQL: ``store/versions.py``),
and re-reads full rows only for what is new or whose version moved. A cycle
over 10,000 queued jobs therefore decodes a handful of rows instead of 10,000.
Because every write bumps ``version`` (guarded updates), nothing can be missed;
heartbeats (``last_seen``) do not bump it, and the scheduler does not need them.

``rebuild`` drops everything (start, change of leader); ``load`` is the
incremental read. The queued jobs' full records are kept too: the placement
transaction writes from them (guarded by the version the snapshot saw)
instead of reading every placed job again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from operator import attrgetter, itemgetter
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Allocation, Node
from corral.scheduler.api import Snapshot
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store import versions
from corral.server.store.records import AllocRecord, JobRecord

CHUNK = 500  # ids per IN (...) query: far below SQLite's bound-parameter limit
_FIRST = itemgetter(0)
_JOB = attrgetter("job")

T = TypeVar("T")


class SnapshotCache:
    """Queued jobs, active allocations and nodes as of the last ``load``, with their versions."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self._queued: set[tuple[str, int]] = set()  # (id, version) of each job in ``jobs``
        self.allocations: dict[str, tuple[int, Allocation]] = {}
        self.expected_ends: dict[str, float] = {}
        self.nodes: dict[str, tuple[int, Node]] = {}
        self.rows_read = 0  # full rows decoded by the last load (for tests and metrics)

    def rebuild(self) -> None:
        self.jobs.clear()
        self._queued.clear()
        self.allocations.clear()
        self.expected_ends.clear()
        self.nodes.clear()

    async def load(
        self,
        conn: AsyncConnection,
        fresh: dict[str, JobRecord] | None = None,
        fresh_allocs: dict[str, AllocRecord] | None = None,
    ) -> tuple[Snapshot, dict[str, JobRecord]]:
        """The current snapshot and the queued jobs' records it saw (their versions with them).

        ``fresh`` / ``fresh_allocs``: records the server just inserted
        (``Runtime.fresh_jobs`` / ``fresh_allocs``); one whose version the version read
        confirms is taken instead of reading its row again. Both mappings are emptied.
        """
        self.rows_read = 0
        seen = await versions.read(conn)  # on PostgreSQL one round trip
        order = seen.queued
        await self._refresh_jobs(conn, order, fresh or {})
        if fresh:
            fresh.clear()
        await self._refresh_allocations(conn, seen.active, fresh_allocs or {})
        if fresh_allocs:
            fresh_allocs.clear()
        await self._refresh_nodes(conn, seen.nodes)
        # In the version read's order; a job whose row moved on since is left for the next
        # cycle. Built by C-level iteration: this runs over every queued job, every cycle.
        in_order = filter(None, map(self.jobs.get, map(_FIRST, order)))
        snapshot = Snapshot(
            nodes=tuple(n for _, n in self.nodes.values()),
            queued=tuple(map(_JOB, in_order)),
            allocations=tuple(a for _, a in self.allocations.values()),
            teams=tuple(seen.teams),
            expected_ends=self.expected_ends,
        )
        return snapshot, dict(self.jobs)

    async def _refresh_jobs(
        self, conn: AsyncConnection, order: list[tuple[str, int]], fresh: dict[str, JobRecord]
    ) -> None:
        # Only the difference is walked: on a deep queue almost every (id, version) pair is
        # the one held already, and a Python loop over all of them cost more than the read.
        wanted = set(order)
        jobs, held = self.jobs, self._queued
        for job_id, _ in held - wanted:  # left the queue, or its row moved on
            jobs.pop(job_id, None)
        self._queued = wanted  # less, below, the rows that could not be read as seen
        stale: list[tuple[str, int]] = []
        for job_id, version in wanted - held:
            rec = fresh.get(job_id)
            if rec is not None and rec.version == version:
                jobs[job_id] = rec
            else:
                stale.append((job_id, version))

        async def fetch(ids: list[str]) -> list[JobRecord]:
            return list((await job_repo.get_many(conn, ids)).values())

        for rec in await _chunked([job_id for job_id, _ in stale], fetch):
            if (rec.job.id, rec.version) in wanted:  # else it moved on since: next cycle
                jobs[rec.job.id] = rec
        for pair in stale:
            if pair[0] not in jobs:  # moved on or gone since the version read
                wanted.discard(pair)
        self.rows_read += len(stale)

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


async def _chunked(
    keys: Sequence[str], fetch: Callable[[list[str]], Awaitable[list[T]]]
) -> list[T]:
    out: list[T] = []
    for i in range(0, len(keys), CHUNK):
        out.extend(await fetch(list(keys[i : i + CHUNK])))
    return out
