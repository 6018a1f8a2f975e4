"""Verify a Plan against the latest state and apply the accepted part (STYLE.md habit 3).

The scheduler decided on a snapshot; by the time the plan arrives, a job may
have been cancelled, a node paused or lost. ``apply_plan`` checks what each
decision depends on inside one short transaction (a job's row is not read
again: its update is guarded by the version the snapshot saw, so a job that
moved on fails that update; nodes are re-read), applies every placement
group (one batch, or all replicas of a gang) inside a savepoint so a gang is
all or nothing, and skips what went stale: it is retried next cycle, never
forced. Messages to agents go out after the commit.

A placement that ``preempts`` others is not applied yet: its victims get
their stop (with a grace period to checkpoint) and the job stays queued
until they have ended; the scheduling loop keeps it out of the next
snapshots meanwhile, so the same room is not bought twice. A consolidation move
(``Preemption.move_to``) is applied as a preemption (the job is requeued and
placed again by a later cycle), counted apart (``corral_consolidation_moves``,
the event's ``move_to``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core.events import EventKind
from corral.core.model import Allocation
from corral.core.states import JOB, JobState, StopReason, transition
from corral.scheduler.allocation import allocation_of
from corral.scheduler.api import Placement, Plan
from corral.server.agentlink.base import Assignment, JobWork
from corral.server.services.rendezvous import NO_MASTER, master_at
from corral.server.services.settling import request_stop
from corral.server.services.unit import Runtime, Tx
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.ids import sortable_id
from corral.server.store.records import AllocRecord, JobRecord


@dataclass
class Applied:
    """What one plan changed."""

    placed: list[Assignment] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)  # consolidation moves (stopped, requeued)
    # job id -> allocation ids that must end before it is placed (see the module doc)
    awaiting: dict[str, frozenset[str]] = field(default_factory=dict)
    stale: int = 0  # placement groups or preemptions skipped because the state moved on
    reflagged: list[str] = field(default_factory=list)  # allocations whose borrowed flag moved
    inserted: list[AllocRecord] = field(default_factory=list)  # the allocations placed


async def apply_plan(rt: Runtime, plan: Plan, seen: Mapping[str, JobRecord]) -> Applied:
    """Apply ``plan``; ``seen`` are the queued jobs' records the scheduler was told."""
    applied = Applied()
    if not plan.placements and not plan.preemptions and not plan.reflags:
        return applied
    async with rt.tx(durable=False) as tx:  # placements are recovered by reconciliation
        await _apply(rt, tx, plan, seen, applied)
        for a in applied.placed:
            tx.then(_sender(rt, a))
    rt.metrics.placements.inc(len(applied.placed))
    rt.metrics.preemptions.inc(len(applied.preempted))
    rt.metrics.consolidations.inc(len(applied.moved))
    return applied


async def _apply(
    rt: Runtime,
    tx: Tx,
    plan: Plan,
    seen: Mapping[str, JobRecord],
    applied: Applied,
) -> None:
    schedulable: dict[str, bool] = {}  # node -> taking work (read once per plan)
    lone: list[Placement] = []  # one job on one node: placed together (_place_lone)
    for group in _groups(plan.placements):
        victims = frozenset(v for p in group for v in p.preempts)
        if victims:
            applied.awaiting.update(dict.fromkeys(group[0].job_ids, victims))
            continue
        if len(group) == 1 and len(group[0].job_ids) == 1:
            lone.append(group[0])
            continue
        await _place_lone(rt, tx, lone, seen, schedulable, applied)  # events stay in order
        lone = []
        if not await _place_atomically(rt, tx, group, seen, schedulable, applied):
            applied.stale += 1
    await _place_lone(rt, tx, lone, seen, schedulable, applied)
    for p in plan.preemptions:
        rec = await alloc_repo.get(tx.conn, p.allocation_id)
        if rec is None or not rec.alloc.active:
            applied.stale += 1
            continue
        grace = rt.settings.scheduling.preemption_grace_s
        if await request_stop(rt, tx, rec, StopReason.PREEMPT, grace):
            # a move is a preemption the job comes back from at once, elsewhere
            (applied.moved if p.move_to else applied.preempted).append(p.allocation_id)
            moved = {"move_to": p.move_to} if p.move_to else {}
            for job_id in rec.alloc.job_ids:
                tx.emit(
                    EventKind.JOB_PREEMPTED,
                    team=rec.alloc.team,
                    job_id=job_id,
                    node=rec.alloc.node,
                    data=moved,
                    for_job=p.for_job,
                    why=p.reason,
                )
    await _reflag(tx, plan.reflags, applied)


async def _reflag(tx: Tx, reflags: Sequence[tuple[str, bool]], applied: Applied) -> None:
    """Move ``borrowed`` flags as the plan says (``scheduler/borrowing.py``); an allocation
    that ended or changed since is left to the next cycle's plan."""
    if not reflags:
        return
    recs = {r.alloc.id: r for r in await alloc_repo.get_many(tx.conn, [a for a, _ in reflags])}
    for alloc_id, borrowed in reflags:
        rec = recs.get(alloc_id)
        if rec is None or not rec.alloc.active or rec.alloc.borrowed == borrowed:
            continue
        if await alloc_repo.update(tx.conn, rec, borrowed=borrowed):
            applied.reflagged.append(alloc_id)


def _groups(placements: Sequence[Placement]) -> list[list[Placement]]:
    """Placements that stand or fall together: same job ids (a gang's replicas, or one batch)."""
    groups: dict[tuple[str, ...], list[Placement]] = defaultdict(list)
    for p in placements:
        groups[p.job_ids].append(p)
    return list(groups.values())


async def _place_lone(
    rt: Runtime,
    tx: Tx,
    lone: list[Placement],
    seen: Mapping[str, JobRecord],
    schedulable: dict[str, bool],
    applied: Applied,
) -> None:
    """Placements of one job on one node, each standing or falling on its own as
    ``_place_atomically`` would place it, but their jobs moved in one guarded update and
    their allocations inserted together: on PostgreSQL two round trips for a cycle's
    placements instead of two each, under the lock that orders event commits."""
    ready: list[tuple[JobRecord, Allocation, dict[str, Any]]] = []
    for p in lone:
        jobs = {j: seen[j] for j in p.job_ids if j in seen}
        if not await _still_valid(tx, [p], jobs, schedulable):
            applied.stale += 1
            continue
        rec = jobs[p.job_ids[0]]
        job = rec.job
        alloc = allocation_of(p, job, id=_unique_id(), attempt=job.attempt + 1)
        ready.append((rec, alloc, _placed_values(tx, rec, [alloc.id], alloc)))
    moved = await job_repo.update_many(tx.conn, [(rec, values) for rec, _, values in ready])
    placed: list[AllocRecord] = []
    for rec, alloc, values in ready:
        if rec.job.id not in moved:
            applied.stale += 1  # it changed since the snapshot: retried next cycle
            continue
        _emit_placed(tx, rec, values)
        placed.append(AllocRecord(alloc=alloc, created_at=tx.now))
        applied.placed.append(assignment(alloc, [rec], replicas=1))
    await alloc_repo.insert_many(tx.conn, placed)
    rt.placed(placed)
    applied.inserted.extend(placed)


def _placed_values(
    tx: Tx, rec: JobRecord, alloc_ids: list[str], alloc: Allocation
) -> dict[str, Any]:
    """The columns a job placed on ``alloc`` (and ``alloc_ids`` in all) gets."""
    target = transition(JOB, rec.job.id, rec.state, JobState.PLACED, at=tx.now, why="placed")
    resumed = (rec.checkpoint_step or 0) if rec.checkpoint else None  # what it will get
    return {
        "state": target.value,
        "attempt": alloc.attempt,
        "allocation_ids": alloc_ids,
        "node": alloc.node,
        "resumed_step": resumed,
    }


def _emit_placed(tx: Tx, rec: JobRecord, values: dict[str, Any]) -> None:
    resumed = values["resumed_step"]
    tx.emit(
        EventKind.JOB_PLACED,
        team=rec.job.team,
        job_id=rec.job.id,
        node=values["node"],
        state="placed",
        attempt=values["attempt"],
        allocations=values["allocation_ids"],
        data=_resumed(resumed, values["node"]),
    )


def _resumed(step: int | None, node: str) -> dict[str, Any]:
    """What a placed event says of the checkpoint the attempt starts from: the step, and a
    line for people ("resumed from step 45 on node X") an event stream can show as it is."""
    if step is None:
        return {}
    return {"resumed_from_step": step, "message": f"resumed from step {step} on node {node}"}


async def _place_atomically(
    rt: Runtime,
    tx: Tx,
    group: list[Placement],
    seen: Mapping[str, JobRecord],
    schedulable: dict[str, bool],
    applied: Applied,
) -> bool:
    """``_place_group`` all or nothing: False (and nothing written) when anything is stale.

    One job on one node needs no savepoint: its only write that can fail (the
    guarded job update) comes first. A batch or a gang gets a savepoint.
    """
    mark = tx.mark()
    if len(group) == 1 and len(group[0].job_ids) == 1:
        placed = await _place_group(rt, tx, group, seen, schedulable, applied)
    else:
        async with tx.conn.begin_nested() as savepoint:
            placed = await _place_group(rt, tx, group, seen, schedulable, applied)
            if not placed:
                await savepoint.rollback()
    if not placed:
        tx.undo_since(mark)  # the events of a group's first jobs go with its rows
    return placed


async def _place_group(
    rt: Runtime,
    tx: Tx,
    group: list[Placement],
    seen: Mapping[str, JobRecord],
    schedulable: dict[str, bool],
    applied: Applied,
) -> bool:
    """Move the jobs to placed, then insert the allocations (noted in ``applied``);
    False when anything is stale.

    The jobs' records are the snapshot's: each update is guarded by the version
    it saw, so a job changed since (cancelled, placed elsewhere) makes it fail.
    """
    job_ids = group[0].job_ids
    jobs = {j: seen[j] for j in job_ids if j in seen}
    if not await _still_valid(tx, group, jobs, schedulable):
        return False
    attempt = max(r.job.attempt for r in jobs.values()) + 1
    first = jobs[job_ids[0]].job
    allocs = [allocation_of(p, first, id=_unique_id(), attempt=attempt) for p in group]
    alloc_ids = [a.id for a in allocs]
    for rec in jobs.values():
        values = _placed_values(tx, rec, alloc_ids, allocs[0])
        if not await job_repo.update(tx.conn, rec, **values):
            return False
        _emit_placed(tx, rec, values)
    placed = [AllocRecord(alloc=alloc, created_at=tx.now) for alloc in allocs]
    await alloc_repo.insert_many(tx.conn, placed)
    rt.placed(placed)
    applied.inserted.extend(placed)
    master = NO_MASTER
    if first.replicas > 1:
        master = await master_at(tx.conn, min(allocs, key=lambda a: a.replica))
    works = list(jobs.values())
    applied.placed.extend(assignment(a, works, replicas=len(group), master=master) for a in allocs)
    return True


async def _still_valid(
    tx: Tx,
    group: list[Placement],
    jobs: dict[str, JobRecord],
    schedulable: dict[str, bool],
) -> bool:
    """Every job seen queued by the snapshot, every node still taking work.

    Whether a job is still as seen is left to its guarded update.
    """
    if len(jobs) != len(group[0].job_ids):
        return False
    if any(rec.state is not JobState.QUEUED for rec in jobs.values()):
        return False
    for p in group:
        if p.node not in schedulable:
            schedulable[p.node] = await node_repo.schedulable(tx.conn, p.node)
        if not schedulable[p.node]:
            return False
    return True


def _unique_id() -> str:
    # The scheduler's ids are only unique within one plan; the store needs them unique forever.
    return sortable_id("al_")


def assignment(
    alloc: Allocation,
    jobs: Sequence[JobRecord],
    *,
    replicas: int | None = None,
    master: tuple[str, int] = NO_MASTER,
) -> Assignment:
    """The message that tells an agent to run ``alloc`` (``replicas``: of its gang; by
    default its jobs' own; ``master``: the gang's rendezvous, ``rendezvous.master_of``)."""
    if replicas is None:
        replicas = max((r.job.replicas for r in jobs), default=1)
    work = tuple(
        JobWork(
            job_id=r.job.id,
            kind=r.job.kind,
            payload=r.job.payload,
            model=r.job.model,
            backend=r.job.backend,
            timeout_s=r.job.timeout_s,
            checkpoint=r.checkpoint,
            checkpoint_step=r.checkpoint_step or 0,
            inputs=r.job.inputs,
        )
        for r in sorted(jobs, key=lambda r: alloc.job_ids.index(r.job.id))
    )
    return Assignment(
        allocation_id=alloc.id,
        attempt=alloc.attempt,
        node=alloc.node,
        jobs=work,
        replica=alloc.replica,
        replicas=replicas,
        gpu_indices=alloc.gpu_indices,
        gpu_milli=alloc.gpu_milli,
        vram_bytes=alloc.vram_bytes,
        cpus=alloc.cpus,
        on_cpu=alloc.on_cpu,
        memory_bytes=alloc.memory_bytes,
        master_addr=master[0],
        master_port=master[1],
    )


def _sender(rt: Runtime, a: Assignment) -> Callable[[], Awaitable[None]]:
    async def send() -> None:
        await rt.link.assign(a.node, a)

    return send
