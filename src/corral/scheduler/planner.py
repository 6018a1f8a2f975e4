"""``Planner``: the decisions of one cycle, job by job.

For each job, in the order the passes give: check the team's quota, find
room for every replica on the working copy (one replica, or a gang all or
nothing), else backfill it into a reservation it ends before, else make room
by preemption when the job is owed it, else run it on CPU slots when its
class allows and it says it can; else it stays queued (and, when it is the
first big job of its class to wait, the nodes that should free up for it
first are reserved: ``reservation.py``). A placed sample job takes
compatible queued jobs into its allocation (a batch).

Every "does not fit" answer is remembered until capacity is given back (a
memo keyed by the capacity generation), so ``live`` can tell from memos
alone that no job of a group can be placed now: the passes skip the group.
Reasons for the jobs left queued are worked out at the end (``explanation``).

Over 400 lines on purpose: the steps of one decision (fit, backfill, preempt, offload,
record) share the cycle's memos and working copy; apart they would pass it all around.
Consolidation moves (``consolidation.py``) come after preemption, for one-replica jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from corral.core.model import Job, PriorityClass
from corral.core.resources import MILLI, MILLI_CPU
from corral.scheduler.api import Placement, Plan, Preemption, Reason, ReasonCode, Remedy, Unplaced
from corral.scheduler.batching import Batcher
from corral.scheduler.consolidation import Consolidator
from corral.scheduler.cycle import Cycle, Memo, current
from corral.scheduler.explain import explain, simple, when_evictable
from corral.scheduler.fit import Fit
from corral.scheduler.gang import place_gang
from corral.scheduler.groups import Group
from corral.scheduler.need import Need
from corral.scheduler.preemption import Ask, Preemptor, Room, ask_for, evicts
from corral.scheduler.queues import Queue
from corral.scheduler.quota import Ledger
from corral.scheduler.reservation import NodeWork, Reservations
from corral.scheduler.routing import ModelRouter, lacking_reason, on_lacking
from corral.scheduler.victims import VictimIndex

Explanation = tuple[tuple[Reason, ...], Remedy]
CYCLE_LIMIT = simple(ReasonCode.CYCLE_LIMIT, "cycle placement limit reached", Remedy.WAIT)
# Empty and never changed: the common placement (nobody preempted) makes no list or dict
_NO_ROOMS: Final[list[Room]] = []
_NO_PREEMPTS: Final[dict[str, tuple[str, ...]]] = {}
# "/1", "/2", ...: an allocation id is its job's id and attempt number, joined once per
# placement (one concatenation, where formatting made the number's string as well)
_ATTEMPTS: Final = tuple(f"/{n}" for n in range(1, 17))


class Planner:
    """Collects one cycle's placements, preemptions and unplaced jobs."""

    def __init__(
        self,
        cycle: Cycle,
        ledger: Ledger,
        queue: Queue,
        victims: VictimIndex,
        classes: Mapping[str, PriorityClass],
        *,
        model_sizes: Mapping[str, int],
        node_work: NodeWork,
        explain: bool = True,
    ) -> None:
        self.config = config = cycle.config
        self.now = cycle.now
        self.classes = classes
        self.cycle = cycle
        self.ledger = ledger
        self.queue = queue
        self.explain = explain
        self._victims = victims
        self._preemptor: Preemptor | None = None  # built on first need: most cycles preempt nothing
        self._consolidator: Consolidator | None = None  # likewise
        self.batcher = Batcher.over(queue.batches, config.max_batch_size)
        self.router = ModelRouter(cycle, config, model_sizes)
        self._route = self.router.enabled  # wait for a model's holder when quicker (routing.py)
        self.reservations = Reservations(cycle, node_work)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.unplaced: list[Unplaced] = []
        self.decided: set[str] = set()  # placed, or left with a reason of their own
        self.reasons: dict[str, Explanation] = {}  # those reasons (a wait for a model holder)
        self.stopped = False  # the cycle placement limit was reached
        self.riders: tuple[Job, ...] = ()  # jobs that joined the last placement (a batch)
        self.lent: dict[str, int] = {}  # team -> milli-GPUs placed as borrowed this cycle
        self.position = 0
        self._explained: Memo[tuple[Need, str | None], tuple[int, Explanation]] = cycle.memo()
        self._no_room: Memo[tuple[Need, Ask, bool], int] = cycle.memo()
        self._patient: Memo[tuple[Need, Ask, int], tuple[int, Reason | None]] = cycle.memo()
        self._gang_failed: Memo[tuple[Need, int], int] = cycle.memo()
        self._preempt_failed: Memo[tuple[Need, int, Ask], int] = cycle.memo()
        # made once per (pass kind, class, team): asked for on every liveness check after a
        # failed fit; an equal Ask, so the memos above see the same keys
        self._asks: tuple[dict[str, dict[str, Ask]], dict[str, dict[str, Ask]]] = ({}, {})

    def ask(
        self,
        team: str,
        pclass: PriorityClass,
        guaranteed: bool,
        by_team: dict[str, Ask] | None = None,
    ) -> Ask:
        """``ask_for(team, pclass, guaranteed)``, made once per cycle (classes keep their names).
        ``by_team``: ``asks(pclass, guaranteed)``, when the caller holds it (one look-up)."""
        if by_team is None:
            by_team = self.asks(pclass, guaranteed)
        ask = by_team.get(team)
        if ask is None:
            ask = by_team[team] = ask_for(team, pclass, guaranteed)
        return ask

    def asks(self, pclass: PriorityClass, guaranteed: bool) -> dict[str, Ask]:
        """The asks made this cycle for ``pclass`` in one kind of pass, by team (a pass
        holds it: ``passes.Liveness``)."""
        by_class = self._asks[1] if guaranteed else self._asks[0]
        by_team = by_class.get(pclass.name)
        if by_team is None:
            by_team = by_class[pclass.name] = {}
        return by_team

    @property
    def preemptor(self) -> Preemptor:
        if self._preemptor is None:
            self._preemptor = Preemptor(
                self._victims,
                self.now,
                self.config.min_runtime_before_preemption_s,
                self.cycle,
            )
        return self._preemptor

    @property
    def consolidator(self) -> Consolidator:
        if self._consolidator is None:
            config = self.config
            least, moves = config.min_runtime_before_preemption_s, config.consolidation_moves
            self._consolidator = Consolidator(
                self._victims, self.preemptor, self.now, least, moves, self.cycle
            )
        return self._consolidator

    def state(self) -> tuple[int, int]:
        """What, when it changes, may bring many groups back to ``live``: capacity given
        back, a new reservation (room to backfill)."""
        return (self.cycle.cap.generation, len(self.reservations.held))

    def consider(self, job: Job, pclass: PriorityClass, guaranteed: bool) -> bool:
        """Decide ``job`` now; True when it was placed. ``guaranteed``: the within-quota pass."""
        if job.id in self.decided:
            return False
        return self.decide(job, self.queue.groups[job.id], pclass, guaranteed)

    def decide(self, job: Job, group: Group, pclass: PriorityClass, guaranteed: bool) -> bool:
        """``consider`` for a job of ``group`` known not to be decided yet (a pass's fair
        queue hands out only such jobs, and knows their group: no look-up by id)."""
        limit = self.config.max_placements_per_cycle
        if limit is not None and len(self.placements) >= limit:
            self.stopped = True
            if not self.explain:
                self.leave(job, CYCLE_LIMIT)  # callers watch for it
            return False
        lowest = group.lowest  # the need's nominal milli x the replicas
        if guaranteed and not self.ledger.within_quota(job.team, lowest):
            return False
        if not guaranteed and not self.ledger.within_limit(job.team, lowest):
            return False
        return self._place(job, pclass, group.need, guaranteed)

    def live(self, group: Group, pclass: PriorityClass, guaranteed: bool) -> bool:
        """Might a job of ``group`` be placed now (or change something)? False when the
        quota says no, or every way ``_place`` has failed on a memo since capacity was last
        given back: then its jobs are skipped, not tried one by one."""
        return self.in_quota(group, guaranteed) and self.may_fit(group, pclass, guaranteed)

    def in_quota(self, group: Group, guaranteed: bool) -> bool:
        """Is there quota (guaranteed pass) or borrowing room (the other) for a job of it?"""
        lowest = group.lowest
        if guaranteed:
            return self.ledger.within_quota(group.team, lowest)
        return self.ledger.within_limit(group.team, lowest)

    def may_fit(
        self,
        group: Group,
        pclass: PriorityClass,
        guaranteed: bool,
        asks: dict[str, Ask] | None = None,
    ) -> bool:
        """Has some way of placing a job of ``group`` not failed yet (memos of its need)?
        ``asks``: ``asks(pclass, guaranteed)``, when the caller holds it."""
        need, replicas = group.need, group.replicas
        if not self._fit_failed(need, replicas):
            return True
        if replicas == 1 and self.reservations.could_backfill(need, group.floor):
            return True
        # ``ask.reclaim or ask.priority`` (``_ask``) without the ask: it is looked up, by
        # team, only to key the memo (a borrowing pass of a class that may not preempt
        # asked for one per group and check, to find it may evict nobody)
        if self.config.preemption and (guaranteed or evicts(pclass)):
            ask = self.ask(group.team, pclass, guaranteed, asks)
            key = (need, replicas, ask)
            if not current(self._preempt_failed.data.get(key), self.cycle.cap.generation):
                return True
        moves = replicas == 1 and self.config.preemption and self.config.consolidation_moves
        if moves and self.consolidator.may_help(self.cycle, need, pclass.rank):
            return True
        return group.cpu and pclass.cpu_offload and not self._fit_failed(need.offloaded(), replicas)

    def _fit_failed(self, need: Need, replicas: int) -> bool:
        if replicas == 1:
            return self.cycle.failed(need)
        return current(self._gang_failed.data.get((need, replicas)), self.cycle.cap.generation)

    def _place(self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool) -> bool:
        mark = self.cycle.checkpoint()
        fits = self._fit_all(job, need)
        if fits is not None and self._route:
            wait = self.router.consider(job, need, fits[0], self.now)
            if wait is not None:
                self.cycle.rollback(mark)
                self.router.book(wait)
                self.decided.add(job.id)
                self.reasons[job.id] = (wait.reasons, wait.remedy)
                return False
        if fits is None and not job.gang:
            fit = self.reservations.backfill(need, job.estimated_runtime_s)
            fits = None if fit is None else [fit]
        rooms = _NO_ROOMS
        if fits is None:
            found = self._make_way(job, pclass, need, guaranteed)
            if found is not None:
                fits, rooms = found
        if fits is not None and job.lacking_nodes and on_lacking(job, fits):
            self.cycle.rollback(mark)  # a gang, a backfill or an eviction found such a node
            return False
        if fits is not None:
            charge = sum(f.total_milli for f in fits)
            within = self.ledger.within_quota(job.team, charge)
            if guaranteed and not within:
                self.cycle.rollback(mark)
                return False
            if not guaranteed and not self.ledger.within_limit(job.team, charge):
                self.cycle.rollback(mark)
                return False
            self._record(job, fits, on_cpu=False, borrowed=not within, rooms=rooms)
            return True
        cpu = pclass.cpu_offload and job.resources.cpu_fallback and job.resources.wants_gpu
        cpu_fits = self._fit_all(job, need.offloaded()) if cpu else None
        if cpu_fits is not None:
            self._record(job, cpu_fits, on_cpu=True, borrowed=False, rooms=[])
            return True
        return False

    def _make_way(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool
    ) -> tuple[list[Fit], list[Room]] | None:
        """Room by preemption, else by moving running work (consolidation), else none."""
        if self.config.preemption:
            found = self._fit_with_preemption(job, pclass, need, guaranteed)
            if found is not None:
                return found
        if job.gang or not (self.config.preemption and self.config.consolidation_moves):
            return None
        mine = (job.id, pclass.rank)
        room = self.consolidator.make_room(self.cycle, need, mine, job.lacking_nodes)
        return None if room is None else ([room.fit], [room])

    def head(self, job: Job, pclass: PriorityClass, guaranteed: bool) -> None:
        """Decide the big job at the head of its class first; reserve for it if it cannot
        start (``reservation.py``)."""
        placed = self.consider(job, pclass, guaranteed)
        # A gang bound to a label holds no nodes while it waits: the reservation picks nodes
        # by when they free up, not by label group, and could hold ones it can never use.
        bound = job.gang_label_required and job.gang_label is not None
        if not placed and job.id not in self.decided and not self.stopped and not bound:
            self.reservations.reserve(job.id, self.queue.groups[job.id].need, job.replicas)

    def _fit_with_preemption(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool, patient: bool = False
    ) -> tuple[list[Fit], list[Room]] | None:
        """Every replica where it fits, or where evictions make room; else none (rolled back).

        A failure is remembered (outside the rolled-back what-if) until capacity
        is given back: the same job shape would fail the same way.
        """
        if not (guaranteed or evicts(pclass)):  # the ask's reclaim, priority or across
            return None  # it may evict nobody (and the job did not fit without evictions)
        ask = self.ask(job.team, pclass, guaranteed)
        key = (need, job.replicas, ask)
        generation = self.cycle.cap.generation
        if not patient and current(self._preempt_failed.data.get(key), generation):
            return None
        mark = self.cycle.checkpoint()
        fits: list[Fit] = []
        rooms: list[Room] = []
        for _ in range(job.replicas):
            fit = self.cycle.find(need, job.model, exclude=job.lacking_nodes)
            if fit is not None:
                self.cycle.take(fit, job.estimated_runtime_s)
                fits.append(fit)
                continue
            room = self._make_room(job, pclass, need, guaranteed, patient)
            if room is None:
                self.cycle.rollback(mark)
                if not patient:
                    self._preempt_failed.put(key, generation)
                return None
            fits.append(room.fit)
            rooms.append(room)
        return fits, rooms

    def _fit_all(self, job: Job, need: Need) -> list[Fit] | None:
        """All replicas on the working copy, or none (rolled back)."""
        if not job.gang:
            runtime = job.estimated_runtime_s
            avoid = job.avoid_nodes
            if job.models:  # prefer the nodes that have all of them, as locality would
                avoid = avoid | self.router.without(job.models)
            fit = self.cycle.find(need, job.model, runtime, avoid, job.lacking_nodes)
            if fit is not None:
                self.cycle.take(fit, runtime)
            return None if fit is None else [fit]
        key = (need, job.replicas)
        # A gang bound to a label can fail for want of room in one group while others with
        # the same need fit: its failure says nothing about theirs, so it is not remembered.
        bound = job.gang_label_required and job.gang_label is not None
        if current(self._gang_failed.data.get(key), self.cycle.cap.generation):
            return None
        mark = self.cycle.checkpoint()
        fits = place_gang(self.cycle, need, job.replicas, job.gang_label, required=bound)
        if fits is None:
            self.cycle.rollback(mark)
            if not bound:
                self._gang_failed.put(key, self.cycle.cap.generation)
        return fits

    def _make_room(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool, patient: bool = False
    ) -> Room | None:
        ask = self.ask(job.team, pclass, guaranteed)
        if not (ask.reclaim or ask.priority or ask.across):
            return None
        key = (need, ask, patient)
        if current(self._no_room.data.get(key), self.cycle.cap.generation):
            return None
        room = self.preemptor.make_room(self.cycle, self.ledger, need, ask, patient=patient)
        if room is None:
            self._no_room.put(key, self.cycle.cap.generation)
        return room

    def _record(
        self, job: Job, fits: list[Fit], on_cpu: bool, borrowed: bool, rooms: list[Room]
    ) -> None:
        decided = self.decided
        riders: tuple[Job, ...] = ()
        if not job.gang:
            riders = self.batcher.followers(job, decided, self.now)
        job_ids: tuple[str, ...] = tuple([job.id] + [j.id for j in riders]) if riders else (job.id,)
        for job_id in job_ids:
            decided.add(job_id)
        self.riders = riders
        by_node: dict[str, tuple[str, ...]] = {} if rooms else _NO_PREEMPTS
        for room in rooms:
            ids = tuple(a.id for v in room.victims for a in v.allocs)
            by_node[room.fit.node.name] = by_node.get(room.fit.node.name, ()) + ids
        for replica, fit in enumerate(fits):
            attempt = job.attempt
            if job.gang:
                alloc_id = f"{job.id}/{attempt + 1}/r{replica}"
            elif attempt < len(_ATTEMPTS):
                alloc_id = job.id + _ATTEMPTS[attempt]
            else:
                alloc_id = f"{job.id}/{attempt + 1}"
            self.placements.append(
                Placement(
                    allocation_id=alloc_id,
                    job_ids=job_ids,
                    node=fit.node.name,
                    replica=replica,
                    gpu_indices=fit.node.to_indices(fit.gpus),
                    gpu_milli=fit.milli,
                    vram_bytes=fit.vram,
                    cpus=fit.cpus / MILLI_CPU,
                    on_cpu=on_cpu,
                    memory_bytes=fit.memory,
                    borrowed=borrowed,
                    preempts=by_node.get(fit.node.name, ()) if rooms else (),
                )
            )
            if not on_cpu:
                self.ledger.add(job.team, fit.total_milli)
                if borrowed:
                    self.lent[job.team] = self.lent.get(job.team, 0) + fit.total_milli
        if rooms:
            self._evict(job, rooms)
        self.position += 1

    def _evict(self, job: Job, rooms: list[Room]) -> None:
        """The preemptions that make ``rooms`` for ``job``, each with its reason."""
        for room in rooms:
            moves = room.moves or ("",) * len(room.victims)
            for victim, why, to in zip(room.victims, room.why, moves, strict=True):
                for alloc in victim.allocs:
                    if not why:  # priority preemption inside the team
                        why = f"priority: {job.priority} outranks {alloc.priority}"
                    reason = f"{why}; for {job.id}"
                    self.preemptions.append(
                        Preemption(alloc.id, alloc.job_ids, alloc.node, job.id, reason, to)
                    )

    def explanation(self, job: Job, pclass: PriorityClass) -> Explanation:
        """Why ``job`` is still queued at the end of the cycle, and what could help."""
        reason = self.reasons.get(job.id)
        if reason is not None:
            return reason
        if self.stopped:
            return CYCLE_LIMIT
        need = self.queue.groups[job.id].need
        lowest = need.nominal_milli() * job.replicas
        if not self.ledger.within_limit(job.team, lowest):
            return self._quota_reason(job)
        guaranteed = self.ledger.within_quota(job.team, lowest)
        return self._explain(job, pclass, need, guaranteed)

    def _explain(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool
    ) -> Explanation:
        """Reasons for a job that fits nowhere; reused until capacity is given back."""
        key = (need, job.model)
        cached = self._explained.get(key)
        if cached is not None and cached[0] == self.cycle.cap.generation:
            reasons, remedy = cached[1]
        else:
            reasons, remedy = explain(self.cycle, need, job.model)
            self._explained.put(key, (self.cycle.cap.generation, (reasons, remedy)))
        held = self.reservations.held_by(job.id)
        if held is not None:
            reasons = (*reasons, held)
        if job.lacking_nodes:
            reasons = (*reasons, lacking_reason(job))
        if remedy is Remedy.WAIT:
            helps = self._preemption_would_help(job, pclass, need, guaranteed)
            if helps is not None:
                remedy = Remedy.PREEMPT
                if helps.message:
                    reasons = (*reasons, helps)
        return reasons, remedy

    def _preemption_would_help(
        self, job: Job, pclass: PriorityClass, need: Need, guaranteed: bool
    ) -> Reason | None:
        """Would evictions let the job fit once victims have run long enough? (a what-if)
        If so, a reason saying when the last victim it needs passes its minimum run time
        (an empty message: they all have; the job waits only for their stop)."""
        ask = self.ask(job.team, pclass, guaranteed)
        key = (need, ask, job.replicas)
        cached = self._patient.get(key)
        if cached is not None and cached[0] == self.cycle.cap.generation:
            return cached[1]
        mark = self.cycle.checkpoint()
        found = self._fit_with_preemption(job, pclass, need, guaranteed, patient=True)
        self.cycle.rollback(mark)
        helps = None
        if found is not None:
            least = self.config.min_runtime_before_preemption_s
            helps = when_evictable(job, found[1], self.now, least)
        self._patient.put(key, (self.cycle.cap.generation, helps))
        return helps

    def _quota_reason(self, job: Job) -> Explanation:
        limit = self.ledger.limit(job.team) or 0
        used = self.ledger.used(job.team) / MILLI
        text = (
            f"team {job.team} at its quota + borrowing limit ({used:g} of {limit / MILLI:g} GPUs)"
        )
        return simple(ReasonCode.QUOTA_EXCEEDED, text, Remedy.WAIT)

    def leave(self, job: Job, why: Explanation) -> None:
        """``job`` stays queued, for these reasons."""
        self.decided.add(job.id)
        self.unplaced.append(Unplaced(job.id, self.position, why[0], why[1]))
        self.position += 1

    def plan(self, reflags: list[tuple[str, bool]] | None = None) -> Plan:
        if self._consolidator is not None:
            self._consolidator.give_back(self.cycle)
        return Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            unplaced=tuple(self.unplaced),
            reflags=tuple(reflags) if reflags else (),
        )
