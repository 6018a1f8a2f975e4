"""What changed in the store since the scheduling leader last looked (DESIGN.md section 2).

The store stays the source of truth; the leader keeps a ``Scheduler`` as a
derived cache (``loops/kept.py``) and, before each cycle, tells it what
changed as the four events the simulator raises from its clock
(``sim/policies.py``): a job that entered the queue is submitted, one that
left it is withdrawn, an allocation that became active is started, one that
ended is ended. A row updated while it stayed (a queued job's, an
allocation's expected end or checkpoint) is withdrawn or ended, then
submitted or started as it is now. Nodes and teams are handed over whole when
any changed: they are few, and each change moves the capacity index anyway.

How a change is found:

* queued jobs, on SQLite: the queue's change log, ``job_changes`` (triggers of
  migration 0006 append each job entering, changing in or leaving the queue,
  in commit order; ``queue_view.py``): a cycle reads what changed, never the
  queue;
* queued jobs, on PostgreSQL (its concurrent writers commit out of the log's
  order, so the log stays empty), and allocations and nodes everywhere: the
  ``(id, version)`` of each, one narrow read (``store/versions.py``), against
  the versions held. Every write bumps ``version`` (guarded updates), so
  nothing is missed; heartbeats do not, and the scheduler does not need them.

Only rows new or whose version moved are read whole. A fresh ``ChangeFeed``
holds nothing, so its first read hands over the whole state: that is how the
kept scheduler is built on start and on a change of leader.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.model import Node, Team, named
from corral.server.loops.queue_view import Changed, QueueView
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store import versions
from corral.server.store.records import AllocRecord, JobRecord
from corral.server.store.sql import sqlite_connection

CHUNK = 500  # ids per IN (...) query: far below SQLite's bound-parameter limit

T = TypeVar("T")


@dataclass
class Changes:
    """One read's changes, as the kept scheduler's events (withdrawals and ends first)."""

    withdrawn: list[str] = field(default_factory=list)  # job ids no longer queued as told
    submitted: list[JobRecord] = field(default_factory=list)  # queued now, in submission order
    ended: list[str] = field(default_factory=list)  # allocation ids no longer active as told
    started: list[AllocRecord] = field(default_factory=list)  # active now, new or changed
    nodes: tuple[Node, ...] | None = None  # every node, when any changed; None: as before
    teams: tuple[Team, ...] = ()  # every team


class ChangeFeed:
    """The queued jobs, active allocations and nodes as last told, with their versions."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}  # queued jobs as told, at ``queue``'s versions
        self.queue = QueueView()  # which jobs are queued, at which version, in which order
        self.allocations: dict[str, AllocRecord] = {}  # active allocations as told
        self.nodes: dict[str, tuple[int, Node]] = {}
        self._missing: set[str] = set()  # queued, with no record read at that version yet
        self._follow: bool | None = None  # SQLite with migration 0006's triggers (None: ask)
        self.rows_read = 0  # full rows decoded by the last read (for tests and metrics)

    async def read(self, conn: AsyncConnection) -> Changes:
        """What changed since the last read; the feed then holds the store's state."""
        self.rows_read = 0
        changes = Changes()
        db = sqlite_connection(conn)
        if self._follow is None and db is not None:
            self._follow = job_repo.follows_queue_changes(db)
        if db is not None and self._follow:
            changed = self.queue.follow(db)
            seen = await versions.read(conn, with_queued=False)
        else:
            seen = await versions.read(conn)  # on PostgreSQL one round trip
            changed = self.queue.replace(seen.queued)
        await self._jobs(conn, changed, changes)
        await self._allocations(conn, seen.active, changes)
        await self._nodes(conn, seen.nodes, changes)
        changes.teams = tuple(seen.teams)
        return changes

    def placed(self, records: Sequence[AllocRecord]) -> None:
        """Allocations the leader inserted itself (and started in its scheduler): held as
        told, so the next read reads their rows only if they moved on since."""
        for rec in records:
            self.allocations[rec.alloc.id] = rec

    async def _jobs(self, conn: AsyncConnection, changed: Changed, changes: Changes) -> None:
        """Withdraw the jobs that ``changed`` (left the queue or moved on), then read the
        missing ones: only the difference is walked, never the whole queue."""
        jobs, missing, held = self.jobs, self._missing, self.queue.versions
        for job_id, version in changed.items():
            rec = jobs.get(job_id)
            if rec is not None and rec.version != version:
                del jobs[job_id]
                changes.withdrawn.append(job_id)
            if version is None:
                missing.discard(job_id)
            elif job_id not in jobs:
                missing.add(job_id)

        async def fetch(ids: list[str]) -> list[JobRecord]:
            return list((await job_repo.get_many(conn, ids)).values())

        read = await _chunked(list(missing), fetch)
        self.rows_read += len(missing)
        loaded: set[str] = set()
        for rec in read:
            if held.get(rec.job.id) == rec.version:  # else it moved on since: next read
                jobs[rec.job.id] = rec
                loaded.add(rec.job.id)
        self._missing = missing - loaded
        changes.submitted = [jobs[job_id] for job_id in self.queue.in_order(loaded)]

    async def _allocations(
        self, conn: AsyncConnection, wanted: dict[str, int], changes: Changes
    ) -> None:
        held = self.allocations
        for alloc_id in [a for a, rec in held.items() if wanted.get(a) != rec.version]:
            del held[alloc_id]
            changes.ended.append(alloc_id)
        stale = [alloc_id for alloc_id in wanted if alloc_id not in held]

        async def fetch(ids: list[str]) -> list[AllocRecord]:
            return await alloc_repo.get_many(conn, ids)

        for rec in await _chunked(stale, fetch):
            if rec.alloc.active:  # at the version read (a newer one is read again next)
                held[rec.alloc.id] = rec
                changes.started.append(rec)
        self.rows_read += len(stale)

    async def _nodes(self, conn: AsyncConnection, wanted: dict[str, int], changes: Changes) -> None:
        before = len(self.nodes)
        self.nodes = {k: v for k, v in self.nodes.items() if wanted.get(k) == v[0]}
        stale = [n for n in wanted if n not in self.nodes]

        async def fetch(names: list[str]) -> list[tuple[str, int, Node]]:
            found = await node_repo.get_many(conn, names)
            return [(r.node.name, r.version, named(r.node)) for r in found]

        for key, version, node in await _chunked(stale, fetch):
            self.nodes[key] = (version, node)
        self.rows_read += len(stale)
        if stale or len(self.nodes) != before:
            changes.nodes = tuple(node for _, node in self.nodes.values())


async def _chunked(
    keys: Sequence[str], fetch: Callable[[list[str]], Awaitable[list[T]]]
) -> list[T]:
    out: list[T] = []
    for i in range(0, len(keys), CHUNK):
        out.extend(await fetch(list(keys[i : i + CHUNK])))
    return out
