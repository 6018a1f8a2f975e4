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
cycle limit leaves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from corral.core.errors import InvalidSpec
from corral.core.model import EMPTY, Allocation, Job, Node, Team, frozen_map
from corral.core.resources import cpu_milli
from corral.scheduler.api import Config, Plan, Snapshot
from corral.scheduler.borrowing import reflag
from corral.scheduler.carried import Carried, adjust_on
from corral.scheduler.cluster import Cluster
from corral.scheduler.cycle import Cycle
from corral.scheduler.passes import Passes
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
from corral.scheduler.timers import Timers
from corral.scheduler.victims import VictimIndex

if TYPE_CHECKING:
    from mypy_extensions import i64

DEFAULT_CONFIG = Config()


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
        self._carried = Carried()  # what the last cycle took or gave back (carried.py)
        self._timers = Timers(config, self.classes)  # when time alone may change a plan
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
            sched._timers.queued(job)
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
        self._timers.queued(job)

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
            self._timers.started(alloc)

    def end(self, alloc_id: str) -> Allocation:
        """``alloc_id`` no longer exists (ended, preempted, lost). KeyError if unknown."""
        slot = self._slots.take(alloc_id)
        alloc = slot.alloc
        if alloc.active:
            self._count(slot, alloc, -1, slot.end)
        return alloc

    def reflag(self, alloc_id: str, borrowed: bool) -> None:
        """``alloc_id``'s ``borrowed`` flag is now ``borrowed`` (a plan's ``reflags`` applied):
        it ends and starts again so flagged, keeping its expected end. KeyError if unknown."""
        slot = self._slots.of[alloc_id]
        if slot.alloc.borrowed != borrowed:
            end = slot.end
            self.start(replace(self.end(alloc_id), borrowed=borrowed), end)

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
        self._carried = Carried()
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

    def wake_at(self, now: float) -> float | None:
        """The first instant after ``now`` at which a cycle may place or preempt what a cycle
        at ``now`` did not, with nothing else changing (``timers.py``); None: no such instant.
        A shell runs a cycle then, as it does on an arrival or an end. Asked after every
        cycle, queue or not: that is also when the instants passed are forgotten."""
        wake = self._timers.wake_at(now, self.queue.jobs, self._slots.of)
        return wake if self.queue else None

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
        self._carried.undo(self._cluster)
        names = self._team_numbers.names
        used = {name: t.milli for name, t in zip(names, self._used, strict=True)}
        if not self.queue:
            reflags = self._reflags(Ledger.of_usage(self.teams, used), (), {})
            return Plan(reflags=tuple(reflags)) if reflags else Plan()
        cluster = self._cluster_now()
        cycle = Cycle(cluster, self.config, now, end_at=self._end_at)
        try:
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
            # a moved job holds as much after its move: its flag is its own to keep
            evicted = [p.allocation_id for p in planner.preemptions if not p.move_to]
            plan = planner.plan(self._reflags(ledger, evicted, planner.lent))
        except BaseException:
            cycle.rollback(cycle.start)
            raise
        if not keep:
            self._cluster = None
            return plan
        # Keep the plan's reserves and releases, until the caller says what it applied.
        cycle.cap.commit()
        self._carried.keep(plan, self._slots.of)
        return plan

    def _reflags(
        self, ledger: Ledger, evicted: Iterable[str], lent: Mapping[str, int]
    ) -> list[tuple[str, bool]]:
        """``Plan.reflags``: the teams whose flags no longer cover their excess once the plan
        is applied (``ledger``), or that lose work to its evictions, have their allocations'
        flags brought back (``borrowing.py``). ``lent``: team -> milli placed borrowed."""
        gone = frozenset(evicted)
        of = self._slots.of
        change = dict(lent)  # team -> flagged milli the plan adds (placed) less what it evicts
        for alloc_id in gone:
            slot = of.get(alloc_id)
            if slot is not None and slot.alloc.borrowed and not slot.alloc.on_cpu:
                team = slot.alloc.team
                change[team] = change.get(team, 0) - slot.alloc.milli
        excess: dict[str, int] = {}
        for name, usage in zip(self._team_numbers.names, self._used, strict=True):
            over = max(0, ledger.used(name) - ledger.quota(name))
            # evictions only raise the smallest flagged size: a cover before them stays one
            if not usage.flags.cover(over, change.get(name, 0)):
                excess[name] = over
        if not excess:
            return []
        return reflag((slot.alloc for slot in of.values()), excess, lent, gone)

    def _cluster_now(self) -> Cluster:
        """The kept cluster, rebuilt when selectors or models of the queue outgrew it."""
        cluster = self._cluster
        keys = set(self.queue.label_keys)
        models = set(self.queue.models)
        if cluster is None or cluster.label_keys != keys or not cluster.models >= models:
            self._carried = Carried()
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
            usage = self._used[slot.team]
            usage.milli += alloc.milli if sign > 0 else -alloc.milli  # negated
            usage.flags.count(alloc, sign)
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
            if self._carried.started(cluster, alloc):
                return  # the last cycle took this capacity already
        elif self._carried.ended(alloc.id):
            return  # the last cycle gave this capacity back already
        if node == NOWHERE:
            return
        nc = cluster.cap.nodes[node]  # the kept cluster holds the scheduler's nodes
        milli, vram, cpus = alloc.gpu_milli, alloc.vram_bytes, cpu_milli(alloc.cpus)  # given back
        memory: i64 = alloc.memory_bytes
        if sign > 0:  # ... or taken
            milli, vram, cpus, memory = -milli, -vram, -cpus, -memory
        adjust_on(cluster.cap, nc, alloc.gpu_indices, alloc.on_cpu, milli, vram, cpus, memory)

    def _recompute_end(self, node: i64) -> None:
        """Node index ``node``'s latest expected end, from its active allocations' own."""
        ends = [known for slot in self._here[node] if (known := slot.end) is not None]
        if ends:
            self._end_at[node] = max(ends)
        else:
            self._end_at[node] = None
