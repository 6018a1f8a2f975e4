"""Ending allocations and settling their jobs, inside one unit of work.

Shared by the agent service (an agent reports an ending), the liveness loop
(a node is lost, a stop went unanswered) and the job service (cancel). The
decision itself is ``outcomes.settle``; this module applies it to the rows.

Over 400 lines on purpose: every way an allocation ends (finished, failed, lost, stopped,
preempted) settles its jobs through this one path, its usage recorded in the same unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from corral.core.errors import Conflict
from corral.core.events import EventKind
from corral.core.model import Allocation
from corral.core.model_names import lacked
from corral.core.states import (
    ALLOCATION,
    DESIRED,
    JOB,
    UNSTARTED,
    AllocDesired,
    AllocObserved,
    JobState,
    StopReason,
    transition,
)
from corral.server.agentlink.base import StopOrder
from corral.server.services.attempts import nodes_failing_alike, remember, summary
from corral.server.services.checkpoints import drop_after_commit
from corral.server.services.lacking import settle_lacking
from corral.server.services.node_health import note_outcome
from corral.server.services.outcomes import Ending, Settlement, backoff_s, settle
from corral.server.services.unit import Runtime, Tx
from corral.server.services.usage import record_end
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store.records import AllocRecord, AttemptError, JobRecord, ResultFile

_OBSERVED = {
    Ending.SUCCEEDED: AllocObserved.SUCCEEDED,
    Ending.FAILED: AllocObserved.FAILED,
    Ending.STOPPED: AllocObserved.STOPPED,
    Ending.LOST: AllocObserved.LOST,
}
LIVE = (JobState.PLACED, JobState.RUNNING)


def is_current(job: JobRecord, alloc: Allocation) -> bool:
    """The fencing rule: only the job's current attempt may change the job."""
    return alloc.id in job.allocation_ids and job.state in LIVE and job.job.attempt == alloc.attempt


async def end_allocation(
    rt: Runtime,
    tx: Tx,
    rec: AllocRecord,
    ending: Ending,
    *,
    retryable: bool = True,
    error: str | None = None,
    said: Said | None = None,
) -> None:
    """Record that ``rec`` ended, free its resources, and settle the jobs it still owns,
    with what the agent ``said`` of them (results, a start, jobs that ended otherwise)."""
    said = said or Said()
    alloc = rec.alloc
    observed = alloc.observed
    started = said.started and observed in UNSTARTED
    if observed in UNSTARTED and ending is Ending.SUCCEEDED:
        observed = transition(
            ALLOCATION,
            alloc.id,
            observed,
            AllocObserved.RUNNING,
            at=tx.now,
            why="implied by finished",
        )
    observed = transition(
        ALLOCATION, alloc.id, observed, _OBSERVED[ending], at=tx.now, why=ending.value
    )
    values: dict[str, object] = {"observed": observed.value, "active": False, "ended_at": tx.now}
    if started:
        values["started_at"] = tx.now
    if not await alloc_repo.update(tx.conn, rec, **values):
        raise Conflict(f"allocation {alloc.id} changed while it was being ended")
    await record_end(rt, tx, rec)  # what it used, kept for the usage report
    # The freed capacity matters to work still waiting (a job it requeues pokes on its own).
    tx.reschedule = tx.reschedule or rt.work_waiting
    lacks = ending is Ending.FAILED and bool(lacked(error or ""))  # not the node's fault
    if ending is Ending.SUCCEEDED or (ending is Ending.FAILED and retryable and not lacks):
        await note_outcome(rt, tx, alloc.node, ok=ending is Ending.SUCCEEDED, error=error)
    jobs = await job_repo.get_many(tx.conn, alloc.job_ids)
    stop_reason = StopReason(rec.stop_reason) if rec.stop_reason else None
    for job_id in alloc.job_ids:
        job = jobs.get(job_id)
        if job is None or not is_current(job, alloc):
            continue
        own = said.endings.get(job_id, ending)
        reason = stop_reason
        if own is Ending.STOPPED and reason is None and job.stop_request:
            reason = StopReason(job.stop_request)  # stopped on its own, in a batch running on
        how = How(own, reason, retryable, error, started)
        await _settle_job(rt, tx, job, alloc, how, said.files.get(job_id, ()), said.modified)


@dataclass(frozen=True, slots=True)
class Said:
    """What the agent said of an allocation's jobs with its end."""

    files: Mapping[str, Sequence[ResultFile]] = field(default_factory=dict)  # results by job
    # Work that ended at once: its start came with its end. It is recorded in the same row
    # updates: its time on the allocation and its jobs, each job's ``job.started`` event
    # before its end's.
    started: bool = False
    # Jobs that ended otherwise than the allocation did: a batch cut short (those that
    # finished before the failure succeeded; those that never ran were cut short).
    endings: Mapping[str, Ending] = field(default_factory=dict)
    # What the agent filled in or changed in the request (a default model, a drawn seed).
    modified: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class How:
    """How an allocation ended, as ``outcomes.settle`` needs it."""

    ending: Ending
    stop_reason: StopReason | None
    retryable: bool
    error: str | None
    started: bool = False  # its start came with its end: record that too


async def _settle_job(
    rt: Runtime,
    tx: Tx,
    job: JobRecord,
    alloc: Allocation,
    how: How,
    files: Sequence[ResultFile],
    modified: Mapping[str, str],
) -> None:
    gang = job.job.replicas > 1
    if how.ending is Ending.SUCCEEDED and gang and await _gang_still_running(tx, job, alloc):
        await _record_partial_result(rt, tx, job, files, started=how.started)
        return
    alike = 1
    if how.ending is Ending.FAILED:
        alike = nodes_failing_alike(job.attempt_errors, how.error or "failed", alloc.node)
    ending = how.ending
    if ending is Ending.SUCCEEDED and _interrupted(job) and not (files or job.result):
        ending = Ending.NOTHING_MADE
    missing = lacked(how.error or "") if ending is Ending.FAILED and how.retryable else ()
    if missing:  # another node may have the model (lacking.py)
        decision = await settle_lacking(tx, job, alloc.node, missing, how.error or "")
    else:
        decision = settle(
            ending=ending,
            stop_reason=how.stop_reason,
            failures=job.failures,
            max_attempts=job.job.max_attempts,
            # A replica of a gang fails when a peer vanishes mid-collective, whatever its own
            # exit code says: the gang is retried as one, bounded by max_attempts.
            retryable=how.retryable or gang,
            error=how.error,
            alike_nodes=alike,
            same_failure_nodes=rt.settings.scheduling.same_failure_nodes,
        )
    failed = None
    if decision.count_failure:
        failed = AttemptError(alloc.attempt, alloc.node, how.error or decision.error or "", tx.now)
    await apply_settlement(
        rt,
        tx,
        job,
        decision,
        files=files,
        failed=failed,
        started=how.started,
        ran=ran_as(job, modified) if how.ending is Ending.SUCCEEDED else None,
    )
    if decision.state is not JobState.SUCCEEDED and job.job.replicas > 1:
        # Requeued: the others may checkpoint on their way out (rank 0 holds the weights).
        requeued = decision.state is JobState.QUEUED
        await stop_siblings(rt, tx, job, alloc, StopReason.PREEMPT if requeued else None)


async def apply_settlement(
    rt: Runtime,
    tx: Tx,
    job: JobRecord,
    decision: Settlement,
    *,
    files: Sequence[ResultFile] = (),
    failed: AttemptError | None = None,
    started: bool = False,
    ran: Mapping[str, str] | None = None,
) -> None:
    """Move ``job`` to the decided state with its bookkeeping and event.

    ``failed`` is the attempt that just failed (kept in the job's history); a
    job that fails for good after several attempts reports every one of them.
    ``started``: a placed job's start came with this end; it is recorded with it.
    ``ran``: the model and parameters it ran with (``ran_as``). A final state records
    whether a client interrupted the job.
    """
    history = remember(job.attempt_errors, failed) if failed else list(job.attempt_errors)
    if decision.state is JobState.FAILED and len(history) > 1:
        decision = replace(decision, error=f"{decision.error}. Attempts: {summary(history)}")
    state = job.state
    started = started and state is JobState.PLACED
    started_at = job.started_at  # not a copy of the record with it: a job's end is hot
    if started:
        state = record_start(rt, tx, job)
        started_at = tx.now
    elif state is JobState.PLACED and decision.state is JobState.SUCCEEDED:
        state = transition(JOB, job.job.id, state, JobState.RUNNING, at=tx.now, why="implied")
    target = transition(JOB, job.job.id, state, decision.state, at=tx.now, why=decision.event.value)
    failures = job.failures + (1 if decision.count_failure else 0)
    if target is JobState.QUEUED:
        tx.reschedule = True  # back in the queue: the scheduling loop must see it
        values, data = _requeued(rt, tx.now, job, decision, failures)
        tx.count(lambda: rt.metrics.requeues.labels(_requeue_why(decision)).inc())
    else:
        values, data = _ended(tx.now, job, decision, files, interrupted=_interrupted(job), ran=ran)
        tx.count(lambda: _observe_finish(rt, started_at, target, tx.now))
        drop_after_commit(rt, tx, job.checkpoint)  # it will never resume now
    values |= {"state": target.value, "failures": failures}
    if started:
        values["started_at"] = tx.now
    if failed is not None:
        values["attempt_errors"] = [e.to_json() for e in history]
    data |= {"attempt": job.job.attempt}
    if not await job_repo.update(tx.conn, job, **values):
        raise Conflict(f"job {job.job.id} changed while it was being settled")
    tx.emit(decision.event, team=job.job.team, job_id=job.job.id, state=target.value, data=data)


def record_start(rt: Runtime, tx: Tx, job: JobRecord) -> JobState:
    """A placed job starts now: its transition, ``job.started`` event and wait metric; the
    state it is in (its row, state and ``started_at``, is written by the caller with whatever
    else changes)."""
    running = transition(JOB, job.job.id, job.state, JobState.RUNNING, at=tx.now, why="started")
    tx.emit(
        EventKind.JOB_STARTED,
        team=job.job.team,
        job_id=job.job.id,
        node=job.node,
        state="running",
        attempt=job.job.attempt,
    )
    wait = max(0.0, tx.now - job.job.submitted_at)
    tx.count(lambda: rt.metrics.wait_seconds.observe(wait))
    return running


Changes = tuple[dict[str, object], dict[str, object]]  # row values, event data


def _requeued(
    rt: Runtime, now: float, job: JobRecord, decision: Settlement, failures: int
) -> Changes:
    """Back to the queue: forget the allocations, wait out the backoff if any."""
    backoff = rt.settings.scheduling.retry_backoff_s
    not_before = now + (backoff_s(backoff, failures) if decision.backoff else 0.0)
    values = {"allocation_ids": None, "node": None, "not_before": not_before, "stop_request": None}
    data = {"why": decision.error, "next_attempt": job.job.attempt + 1, "not_before": not_before}
    return dict(values), dict(data)


def _ended(
    now: float,
    job: JobRecord,
    decision: Settlement,
    files: Sequence[ResultFile],
    *,
    interrupted: bool,
    ran: Mapping[str, str] | None,
) -> Changes:
    """A final state: when, why, the result files (kept from every replica), whether a
    client interrupted it (it succeeded with what it made, or made nothing) and what ran."""
    result = [*job.result, *files]
    values: dict[str, object] = {"error": decision.error, "result": [f.to_json() for f in result]}
    data: dict[str, object] = (
        {"error": decision.error} if decision.error else {"files": [f.name for f in result]}
    )
    if interrupted and decision.state in (JobState.SUCCEEDED, JobState.CANCELLED):
        values["interrupted"] = data["interrupted"] = True
    if ran:
        values["ran"] = data["ran"] = dict(ran)
    return {**values, "finished_at": now}, data


def _interrupted(job: JobRecord) -> bool:
    """A client interrupted the job (it ends with what it made, or cancelled with none)."""
    return job.stop_request == StopReason.INTERRUPT.value


def ran_as(job: JobRecord, modified: Mapping[str, str]) -> dict[str, str] | None:
    """The model and parameters a job ran with, as far as the request left them open:
    the model it named, overridden by what the agent reported filling in or changing
    (a backend's loaded checkpoint, a sampler, a seed it drew). None when neither says."""
    ran = {"model": job.job.model} if job.job.model else {}
    ran |= {str(k): str(v) for k, v in modified.items()}
    return ran or None


def _requeue_why(decision: Settlement) -> str:
    """A bounded label (never the error text): preempted, failed, model_missing or lost."""
    if not decision.count_failure:
        return "preempted"
    if decision.backoff:
        return "failed"
    return "model_missing" if lacked(decision.error or "") else "lost"


def _observe_finish(rt: Runtime, started_at: float | None, state: JobState, now: float) -> None:
    rt.metrics.finished.labels(state.value).inc()
    if started_at is not None:
        rt.metrics.run_seconds.observe(max(0.0, now - started_at))


async def _gang_still_running(tx: Tx, job: JobRecord, alloc: Allocation) -> bool:
    for other_id in job.allocation_ids:
        if other_id == alloc.id:
            continue
        other = await alloc_repo.get(tx.conn, other_id)
        if other is not None and other.alloc.active:
            return True
    return False


async def _record_partial_result(
    rt: Runtime, tx: Tx, job: JobRecord, files: Sequence[ResultFile], *, started: bool
) -> None:
    """One replica of a gang succeeded while others run: keep its results (and the job's
    start, when this replica's start came with its end and the job had not started)."""
    values: dict[str, object] = {}
    if started and job.state is JobState.PLACED:
        running = record_start(rt, tx, job)
        values |= {"state": running.value, "started_at": tx.now}
    if files:
        values["result"] = [f.to_json() for f in (*job.result, *files)]
    if values and not await job_repo.update(tx.conn, job, **values):
        raise Conflict(f"job {job.job.id} changed while recording a replica's result")


async def stop_siblings(
    rt: Runtime, tx: Tx, job: JobRecord, alloc: Allocation, reason: StopReason | None = None
) -> None:
    """A gang is all or nothing: when one replica ends badly, stop the others (``PREEMPT``:
    with the preemption grace to checkpoint, the gang being requeued; else cancelled)."""
    s = rt.settings.scheduling
    reason = reason or StopReason.CANCEL
    grace = s.preemption_grace_s if reason is StopReason.PREEMPT else s.stop_grace_s
    for other_id in job.allocation_ids:
        other = await alloc_repo.get(tx.conn, other_id) if other_id != alloc.id else None
        if other is not None and other.alloc.active:
            await request_stop(rt, tx, other, reason, grace)


def stop_job(
    rt: Runtime, tx: Tx, rec: AllocRecord, job_id: str, reason: StopReason, grace_s: float
) -> None:
    """Ask the agent to stop one job of batch ``rec`` (cancelled or interrupted on its own)
    while the rest runs on (after the commit). The allocation's row does not change:
    ``Delivery`` finds such jobs again from their state to resend the order."""
    order = StopOrder(rec.alloc.id, reason, grace_s, job_id)

    async def send() -> None:
        await rt.link.stop(rec.alloc.node, order)

    tx.then(send)


async def request_stop(
    rt: Runtime, tx: Tx, rec: AllocRecord, reason: StopReason, grace_s: float
) -> bool:
    """Ask the agent to stop ``rec`` (after the commit). False if it was already told to."""
    alloc = rec.alloc
    target = AllocDesired.PREEMPT if reason is StopReason.PREEMPT else AllocDesired.STOP
    if not DESIRED.allows(alloc.desired, target):
        return False
    transition(DESIRED, alloc.id, alloc.desired, target, at=tx.now, why=reason.value)
    changed = await alloc_repo.update(
        tx.conn,
        rec,
        desired=target.value,
        stop_reason=reason.value,
        stop_at=tx.now,
        stop_grace_s=grace_s,
    )
    if not changed:
        raise Conflict(f"allocation {alloc.id} changed while stopping it")
    order = StopOrder(alloc.id, reason, grace_s)

    async def send() -> None:
        await rt.link.stop(alloc.node, order)

    tx.then(send)
    return True
