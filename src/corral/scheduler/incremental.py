"""``Scheduler``: ``schedule`` that keeps its working state between cycles.

``schedule(snapshot, ...)`` rebuilds everything from the snapshot each cycle:
node classes, the capacity index under every active allocation, team usage,
the fair queues. A caller that runs cycle after cycle (the simulator, the
server's scheduling loop) can instead keep a ``Scheduler`` and tell it what
changed::

    sched = Scheduler(nodes, teams, config)
    sched.submit(job)                 # queued
    plan = sched.schedule(now)        # decide (nothing changes in the scheduler)
    sched.withdraw(job.id)            # the caller applied a placement: no longer queued
    sched.start(allocation, expected_end)   # ... and it holds resources now
    sched.end(allocation.id)          # it ended (finished, preempted, lost)

It is still pure in the sense that matters: its state is derived from those
inputs alone (``snapshot()`` gives it back as a ``Snapshot``), a cycle
changes nothing in it (the cycle's working copy is rolled back at the end),
and ``sched.schedule(now, seed)`` gives exactly ``schedule(sched.snapshot(),
config, now, seed)`` (a hypothesis test drives both through random changes).
``schedule`` itself is ``Scheduler.from_snapshot(...).schedule(...)``.

``schedule(now, explain=False)`` skips explaining jobs that stay queued and
stops a pass once nothing left in it can be placed (``passes.py``): same
placements and preemptions, ``unplaced`` empty except for the first job a
cycle limit leaves. ``sync(snapshot)`` brings a kept scheduler to a new
snapshot by difference (a caller that only has snapshots, like the server).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING

from corral.core.errors import InvalidSpec
from corral.core.model import EMPTY, Allocation, Job, Node, Team, frozen_map
from corral.scheduler.api import Config, Placement, Plan, QueueDelta, Snapshot
from corral.scheduler.capacity import Capacity
from corral.scheduler.cluster import Cluster
from corral.scheduler.cycle import Cycle
from corral.scheduler.node_cap import NodeCap
from corral.scheduler.passes import Passes
from corral.scheduler.planned import Planned
from corral.scheduler.planner import Planner
from corral.scheduler.queues import Queue
from corral.scheduler.quota import Ledger
from corral.scheduler.slots import (
    NOWHERE,
    RunningCount,
    Slot,
    Slots,
    TeamNumbers,
    TeamUsage,
    join,
    leave,
)
from corral.scheduler.victims import VictimIndex

if TYPE_CHECKING:
    from mypy_extensions import i64

DEFAULT_CONFIG = Config()
_ID = attrgetter("id")
_NAME = attrgetter("name")


class Scheduler:
    """Queued jobs, active allocations, nodes and teams, and the index kept over them."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        teams: Iterable[Team] = (),
        config: Config = DEFAULT_CONFIG,
        *,
        model_sizes: Mapping[str, int] = EMPTY,
    ) -> None:
        self.config = config
        self.classes = {c.name: c for c in config.priority_classes}
        self.served: Mapping[str, float] = {}  # user -> recent service (see served.py)
        self.queue = Queue(self.classes, config.reserve_min_gpus)
        self._slots = Slots()  # the allocations as given, active or not, and their ends
        self._team_numbers = TeamNumbers()  # the teams of allocations given
        self._used: list[TeamUsage] = []  # team number -> milli-GPUs its active allocations hold
        self._running: dict[str, dict[str, RunningCount]] = {}  # class -> user -> count
        self._here: list[list[Slot]] = []  # node index -> slots of its active allocations
        self._end_at: list[float | None] = []  # node index -> latest expected end there
        self._victims = VictimIndex(self.classes, 0)  # what preemption could evict
        self._cluster: Cluster | None = None
        self._pending = Planned()  # the last plan's placements, not yet started
        self._released: dict[str, Allocation] = {}  # its preemptions, not yet ended
        self.nodes: tuple[Node, ...] = ()
        self._index: dict[str, int] = {}
        self.teams: tuple[Team, ...] = ()
        self.model_sizes: Mapping[str, int] = frozen_map(model_sizes)
        self.set_nodes(tuple(nodes))
        self.set_teams(tuple(teams))

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, config: Config = DEFAULT_CONFIG) -> Scheduler:
        """A scheduler holding exactly what ``snapshot`` holds."""
        sched = cls(snapshot.nodes, config=config, model_sizes=snapshot.model_sizes)
        for job in snapshot.queued:
            if not sched.queue.add(job, sort=False):
                raise InvalidSpec("snapshot.queued", f"duplicate {job.id!r}")
        sched.queue.sort()
        ends = snapshot.expected_ends
        for alloc in snapshot.allocations:
            sched.start(alloc, ends.get(alloc.id))
        sched.set_teams(snapshot.teams)
        sched.served = snapshot.served
        return sched

    # -- what changed ---------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """``job`` is queued (placeable from its ``not_before`` on)."""
        if not self.queue.add(job):
            raise InvalidSpec("snapshot.queued", f"duplicate {job.id!r}")

    def withdraw(self, job_id: str) -> Job:
        """``job_id`` is no longer queued (placed, cancelled, failed). KeyError if unknown."""
        return self.queue.remove(job_id)

    def start(self, alloc: Allocation, expected_end: float | None = None) -> None:
        """``alloc`` exists (if active, it holds resources), expected to end at ``expected_end``."""
        slot = self._slots.put(alloc, expected_end, 0, self._index.get(alloc.node, NOWHERE))
        if slot is None:
            raise InvalidSpec("snapshot.allocations", f"duplicate {alloc.id!r}")
        team = slot.team = self._team_numbers.number(alloc.team)
        if team == len(self._used):
            self._used.append(TeamUsage())
        if alloc.active:
            self._count(slot, alloc, +1, expected_end)

    def end(self, alloc_id: str) -> Allocation:
        """``alloc_id`` no longer exists (ended, preempted, lost). KeyError if unknown."""
        slot = self._slots.take(alloc_id)
        alloc = slot.alloc
        if alloc.active:
            self._count(slot, alloc, -1, slot.end)
        return alloc

    @property
    def allocations(self) -> dict[str, Allocation]:
        """Allocation id -> allocation, as given, active or not (a new dict)."""
        return {alloc_id: slot.alloc for alloc_id, slot in self._slots.of.items()}

    @property
    def expected_ends(self) -> dict[str, float]:
        """Allocation id -> its expected end, where known (a new dict)."""
        ends: dict[str, float] = {}
        for alloc_id, slot in self._slots.of.items():
            known = slot.end
            if known is not None:
                ends[alloc_id] = known
        return ends

    def set_nodes(self, nodes: tuple[Node, ...]) -> None:
        index: dict[str, int] = {}
        for i, node in enumerate(nodes):
            if node.name in index:
                raise InvalidSpec("snapshot.nodes", f"duplicate {node.name!r}")
            index[node.name] = i
        self.nodes, self._index = nodes, index
        self._cluster = None
        self._pending, self._released = Planned(), {}
        self._end_at = [None] * len(nodes)
        here: list[list[Slot]] = [[] for _ in nodes]
        for slot in self._slots.of.values():
            at = slot.node = index.get(slot.alloc.node, NOWHERE)
            if at != NOWHERE and slot.alloc.active:
                join(here[at], slot)
        self._here = here
        for at, held in enumerate(here):
            if held:
                self._recompute_end(at)
        self._victims = VictimIndex(self.classes, len(nodes))  # it keys nodes by index
        for slot in self._slots.of.values():
            if slot.alloc.active:
                self._victims.add(slot)

    def set_teams(self, teams: Iterable[Team]) -> None:
        teams = tuple(teams)
        names = [t.name for t in teams]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidSpec("snapshot.teams", f"duplicate {name!r}")
        self.teams = teams

    def set_model_sizes(self, sizes: Mapping[str, int]) -> None:
        self.model_sizes = frozen_map(sizes)

    def sync(self, snapshot: Snapshot, delta: QueueDelta | None = None) -> None:
        """Apply the difference between what is held and ``snapshot`` (objects compared by id).

        ``delta``: how ``snapshot.queued`` differs from the queued jobs held (the caller
        knows ``delta.base`` is what the last sync was given). Used when it adds up and
        its added jobs end the queue (the usual case: new submissions); else every
        queued job is compared."""
        _check_unique(snapshot, queued=delta is None)
        if len(snapshot.nodes) != len(self.nodes) or any(
            a is not b for a, b in zip(snapshot.nodes, self.nodes, strict=True)
        ):
            self.set_nodes(snapshot.nodes)
        if snapshot.teams != self.teams:
            self.set_teams(snapshot.teams)
        if snapshot.model_sizes != self.model_sizes:
            self.set_model_sizes(snapshot.model_sizes)
        self.served = snapshot.served
        if delta is None or not self._sync_delta(snapshot.queued, delta):
            if delta is not None:  # the rest was checked above
                _unique("snapshot.queued", list(map(_ID, snapshot.queued)))
            self._sync_queued(snapshot.queued)
        self._sync_allocations(snapshot.allocations, snapshot.expected_ends)

    def snapshot(self) -> Snapshot:
        """What is held, as the ``Snapshot`` that ``schedule`` would be given."""
        return Snapshot(
            nodes=self.nodes,
            queued=tuple(self.queue.jobs.values()),
            allocations=tuple(slot.alloc for slot in self._slots.of.values()),
            teams=self.teams,
            expected_ends=self.expected_ends,
            model_sizes=self.model_sizes,
            served=self.served,
        )

    # -- deciding -------------------------------------------------------------------

    def schedule(self, now: float = 0.0, seed: int = 0, *, explain: bool = True) -> Plan:
        """One cycle: the same plan as ``schedule(self.snapshot(), config, now, seed)``.

        ``explain=False``: placements and preemptions only (see the module docstring).
        ``seed`` is part of the contract; no current policy needs it.
        """
        return self._decide(now, explain, keep=True)

    def once(self, now: float = 0.0, seed: int = 0) -> Plan:
        """``schedule`` for a throwaway scheduler (``schedule`` itself): the kept cluster is
        left in its end-of-cycle state and dropped, which saves undoing the cycle."""
        return self._decide(now, explain=True, keep=False)

    def _decide(self, now: float, explain: bool, keep: bool) -> Plan:
        """One cycle; ``keep=False`` leaves the kept cluster in its end-of-cycle state and
        drops it (a throwaway scheduler saves the rollback)."""
        self._reconcile()
        if not self.queue:
            return Plan()
        cluster = self._cluster_now()
        cycle = Cycle(cluster, self.config, now, end_at=self._end_at)
        try:
            names = self._team_numbers.names
            used = {name: t.milli for name, t in zip(names, self._used, strict=True)}
            ledger = Ledger.of_usage(self.teams, used, cycle.memo())
            planner = Planner(
                cycle,
                ledger,
                self.queue,
                self._victims,
                self.classes,
                model_sizes=self.model_sizes,
                node_work=self._work,
                explain=explain,
            )
            served = self.served if isinstance(self.served, dict) else dict(self.served)
            Passes(planner, self.queue, self._running, served).run()
            plan = planner.plan()
        except BaseException:
            cycle.rollback(cycle.start)
            raise
        if not keep:
            self._cluster = None
            return plan
        # Keep the plan's reserves and releases: the caller usually applies the plan, and
        # ``start``/``end`` then find the capacity already taken or given back; what it
        # does not apply is undone when the next cycle starts (``_reconcile``).
        cycle.cap.commit()
        self._pending = Planned(plan.placements)
        held = self._slots.of
        for stop in plan.preemptions:
            slot = held.get(stop.allocation_id)
            if slot is not None and slot.alloc.active:
                self._released[stop.allocation_id] = slot.alloc
        return plan

    def _reconcile(self) -> None:
        """Undo what the last plan took or gave back and its caller did not apply."""
        cluster, pending, released = self._cluster, self._pending, self._released
        self._pending, self._released = Planned(), {}
        if cluster is None:
            return
        for p in pending.left():
            _adjust(cluster, p.node, p.gpu_indices, p.on_cpu, p.gpu_milli, p.vram_bytes, p.cpus)
        for a in released.values():
            _adjust(cluster, a.node, a.gpu_indices, a.on_cpu, -a.gpu_milli, -a.vram_bytes, -a.cpus)

    def _cluster_now(self) -> Cluster:
        """The kept cluster, rebuilt when selectors or models of the queue outgrew it."""
        cluster = self._cluster
        keys = set(self.queue.label_keys)
        models = set(self.queue.models)
        if cluster is None or cluster.label_keys != keys or not cluster.models >= models:
            self._pending, self._released = Planned(), {}
            held = (slot.alloc for slot in self._slots.of.values())
            active = [alloc for alloc in held if alloc.active]
            cluster = self._cluster = Cluster(self.nodes, keys, models, active)
        return cluster

    def _work(self, node: str) -> Iterator[tuple[Allocation, float | None]]:
        idx = self._index.get(node)
        if idx is None:
            return
        for slot in self._here[idx]:
            yield slot.alloc, slot.end

    # -- bookkeeping ----------------------------------------------------------------

    def _count(self, slot: Slot, alloc: Allocation, sign: int, expected_end: float | None) -> None:
        """An active allocation (in ``slot``) starts (+1) or ends (-1) holding resources."""
        if not alloc.on_cpu:
            self._used[slot.team].milli += alloc.milli if sign > 0 else -alloc.milli  # negated
        node = slot.node
        if sign > 0:
            slot.count_in(self._running)
            self._victims.add(slot)
            if node != NOWHERE:
                join(self._here[node], slot)
                latest = self._end_at[node]
                if expected_end is not None and expected_end > (
                    -math.inf if latest is None else latest
                ):
                    self._end_at[node] = expected_end
        else:
            slot.uncount()
            self._victims.remove(slot)
            if node != NOWHERE:
                leave(self._here[node], slot)
                latest = self._end_at[node]
                if expected_end is not None and expected_end >= (
                    math.inf if latest is None else latest
                ):
                    self._recompute_end(node)  # it may have been the latest there
        cluster = self._cluster
        if cluster is not None:
            self._hold(cluster, node, alloc, sign)

    def _hold(self, cluster: Cluster, node: i64, alloc: Allocation, sign: int) -> None:
        """The kept cluster's capacity follows an allocation (on node index ``node``) that
        starts (+1) or ends (-1), unless the last cycle's plan took or gave it back already."""
        if sign > 0:
            planned = self._pending.take(alloc.id)
            if planned is not None:
                if _same(planned, alloc):
                    return  # the last cycle took this capacity already
                p = planned  # applied differently: give the planned room back first
                _adjust(cluster, p.node, p.gpu_indices, p.on_cpu, p.gpu_milli, p.vram_bytes, p.cpus)
        elif alloc.id in self._released:
            del self._released[alloc.id]
            return  # the last cycle gave this capacity back already
        if node == NOWHERE:
            return
        nc = cluster.cap.nodes[node]  # the kept cluster holds the scheduler's nodes
        milli, vram, cpus = alloc.gpu_milli, alloc.vram_bytes, alloc.cpus  # given back ...
        if sign > 0:  # ... or taken: negated (multiplying by a negative is slow compiled)
            milli, vram, cpus = -milli, -vram, -cpus
        _adjust_on(cluster.cap, nc, alloc.gpu_indices, alloc.on_cpu, milli, vram, cpus)

    def _recompute_end(self, node: i64) -> None:
        """Node index ``node``'s latest expected end, from its active allocations' own."""
        ends = [known for slot in self._here[node] if (known := slot.end) is not None]
        if ends:
            self._end_at[node] = max(ends)
        else:
            self._end_at[node] = None

    def _sync_delta(self, queued: tuple[Job, ...], delta: QueueDelta) -> bool:
        """Apply ``delta`` if it adds up (counts, gone jobs held, added jobs new and at the
        end of ``queued``, as they are then in the queue's order); False (nothing done) if not."""
        held, gone, added = self.queue.jobs, delta.gone, delta.added
        if len(held) - len(gone) + len(added) != len(queued) or len(set(gone)) != len(gone):
            return False
        tail = queued[len(queued) - len(added) :] if added else ()
        if any(a is not b for a, b in zip(tail, added, strict=True)):
            return False
        if any(job_id not in held for job_id in gone):
            return False
        if any(job.id in held and job.id not in gone for job in added):
            return False
        for job_id in gone:
            self.withdraw(job_id)
        for job in added:
            self.submit(job)
        return True

    def _sync_queued(self, queued: tuple[Job, ...]) -> None:
        """Withdraw what is held and not in ``queued`` (by identity), submit what is new.

        Walks only the difference (sets of object ids, built by C-level iteration): a
        server's loop calls this every cycle with thousands of jobs queued and a few
        changed."""
        held = self.queue.jobs
        have = dict(zip(map(id, held.values()), held, strict=True))  # object id -> job id, held
        want = set(map(id, queued))
        gone = have.keys() - want
        for job_id in sorted(have[oid] for oid in gone):  # by id: the same order every run
            self.withdraw(job_id)
        new = len(queued) - (len(have) - len(gone))
        if new:  # in the snapshot's order; new jobs are mostly at its end
            found: list[Job] = []
            for job in reversed(queued):
                if id(job) not in have:
                    found.append(job)
                    if len(found) == new:
                        break
            for job in reversed(found):
                self.submit(job)
        ids = list(map(_ID, queued))
        if list(held) != ids:  # keep the snapshot's order (it orders explanations)
            self.queue.jobs = dict(zip(ids, map(held.__getitem__, ids), strict=True))

    def _sync_allocations(
        self, allocations: tuple[Allocation, ...], ends: Mapping[str, float]
    ) -> None:
        wanted = {a.id: a for a in allocations}
        slots = self._slots
        for alloc_id in [
            a
            for a, slot in slots.of.items()
            if wanted.get(a) is not slot.alloc or ends.get(a) != slot.end
        ]:
            self.end(alloc_id)
        for new in allocations:
            if new.id not in slots.of:
                self.start(new, ends.get(new.id))
        if list(slots.of) != list(wanted):
            slots.order(list(wanted))


def _check_unique(snapshot: Snapshot, *, queued: bool = True) -> None:
    """Names that identify things must do so: a duplicate is bad input, named.
    ``queued=False``: leave the queued jobs to ``submit``'s own check."""
    _unique("snapshot.nodes", list(map(_NAME, snapshot.nodes)))
    if queued:
        _unique("snapshot.queued", list(map(_ID, snapshot.queued)))
    _unique("snapshot.allocations", list(map(_ID, snapshot.allocations)))
    _unique("snapshot.teams", list(map(_NAME, snapshot.teams)))


def _unique(field: str, names: list[str]) -> None:
    """InvalidSpec naming ``field`` and the first name that repeats in ``names``."""
    if len(set(names)) == len(names):
        return
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidSpec(field, f"duplicate {name!r}")
        seen.add(name)


def _adjust(
    cluster: Cluster,
    node: str,
    indices: tuple[int, ...],
    on_cpu: bool,
    milli: int,
    vram: int,
    cpus: int,
) -> None:
    """Between cycles: give back (positive) or take (negative) capacity on the kept cluster."""
    nc = cluster.cap.by_name.get(node)
    if nc is not None:
        _adjust_on(cluster.cap, nc, indices, on_cpu, milli, vram, cpus)


def _adjust_on(
    cap: Capacity,
    nc: NodeCap,
    indices: tuple[int, ...],
    on_cpu: bool,
    milli: i64,
    vram: i64,
    cpus: i64,
) -> None:
    """``_adjust`` on a node already found (``_hold`` has its index)."""
    cap.adjust(nc, () if on_cpu else nc.to_positions(indices), milli, vram, cpus)


def _same(p: Placement, alloc: Allocation) -> bool:
    """Does ``alloc`` hold exactly what placement ``p`` reserved?"""
    return (
        p.node == alloc.node
        and p.gpu_indices == alloc.gpu_indices
        and p.gpu_milli == alloc.gpu_milli
        and p.vram_bytes == alloc.vram_bytes
        and p.cpus == alloc.cpus
        and p.on_cpu == alloc.on_cpu
    )
