"""The editable queue: ``PATCH /v1/jobs/{id}`` changes a queued job in place.

A queued job's priority class, time limit and labels can change; it can move to the top
of its user's own queue, and be held (it stays queued, is never placed) and released.
Each change is one guarded update of the job's row, so the scheduling loop sees it as
any queue change: the job is withdrawn from the kept scheduler and submitted again as it
is now (``loops/changes.py``); a held one is kept out (``loops/kept.py``). A job that
moved on meanwhile (placed by a cycle) answers 409, never a half-applied change.

Moving to the top does not touch the order between users (fair mixing still decides
whose turn it is): the job becomes its user's next one, before every other queued job
of that user, by taking a place (``queue_at``) just ahead of the user's front.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import Conflict, InvalidSpec, NotFound
from corral.core.events import EventKind
from corral.core.states import JobState
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.unit import Runtime
from corral.server.store import jobs as job_repo
from corral.server.store.records import JobRecord, job_row

AHEAD_S = 0.001
"""How far ahead of its user's front a job moved to the top is placed: any amount orders
it first; a small one leaves its wait (which model routing weighs) as it was."""


@dataclass(frozen=True, slots=True)
class JobEdit:
    """What a PATCH changes; None leaves a field as it is."""

    priority: str | None = None
    timeout_s: float | None = None
    labels: Mapping[str, str] | None = None
    hold: bool | None = None  # True: hold; False: release
    top: bool = False  # move to the top of its user's own queue

    def empty(self) -> bool:
        return self == JobEdit()


Entitle = Callable[[Principal, str, str, str], Awaitable[None]]
"""May ``who`` put work of this team and user in this class (``PolicyService.entitle``)?"""


async def edit(
    rt: Runtime, who: Principal, job_id: str, change: JobEdit, entitle: Entitle
) -> JobRecord:
    """Apply ``change`` to a queued job visible to ``who``; the job as it is now. A new class
    must be one the policy lets the job's team or user use (403 naming class and team)."""
    who.require_client()
    if change.empty():
        raise InvalidSpec("body", "name at least one of priority, timeout_s, labels, hold, top")
    if change.priority is not None:
        async with rt.db.read() as conn:
            found = await job_repo.get(conn, job_id)
        if found is None or not who.sees(found.job.team):
            raise NotFound(f"job {job_id} not found")
        await entitle(who, found.job.team, found.job.user, change.priority)
    async with rt.tx(reschedule=True) as tx:
        rec = await job_repo.get(tx.conn, job_id)
        if rec is None or not who.sees(rec.job.team):
            raise NotFound(f"job {job_id} not found")
        if rec.state is not JobState.QUEUED:
            raise Conflict(f"job {job_id} is {rec.state.value}: only a queued job can be edited")
        values, said = await _values(tx.conn, rec, change)
        if values and not await job_repo.update(tx.conn, rec, **values):
            raise Conflict(f"job {job_id} changed while editing it; retry")
        if said:
            line = f"{'; '.join(said)} (by {who.name})"
            tx.emit(EventKind.JOB_LOG, team=rec.job.team, job_id=job_id, lines=[line])
            await audit.record(tx, who, "job.edit", job_id, {"team": rec.job.team, "did": said})
        updated = await job_repo.get(tx.conn, job_id)
    assert updated is not None
    return updated


async def _values(
    conn: AsyncConnection, rec: JobRecord, change: JobEdit
) -> tuple[dict[str, object], list[str]]:
    """The columns to set, and what each change did in words (the job's log line)."""
    values: dict[str, object] = {}
    said: list[str] = []
    job = rec.job
    if change.priority is not None and change.priority != job.priority:
        values["priority"] = change.priority
        said.append(f"priority {job.priority} -> {change.priority}")
    if change.timeout_s is not None and change.timeout_s != job.timeout_s:
        values["timeout_s"] = change.timeout_s
        said.append(f"time limit {change.timeout_s:g}s")
    if change.labels is not None and dict(change.labels) != dict(rec.labels):
        spec = dict(job_row(rec)["spec"])
        spec.pop("labels", None)
        values["spec"] = {**spec, **({"labels": dict(change.labels)} if change.labels else {})}
        shown = ", ".join(f"{k}={v}" for k, v in change.labels.items())
        said.append(f"labels {shown or 'cleared'}")
    if change.hold is not None and change.hold != rec.held:
        values["held"] = change.hold
        said.append("held" if change.hold else "released")
    if change.top:
        front = await job_repo.user_queue_front(conn, job.team, job.user)
        mine = rec.queue_at if rec.queue_at is not None else job.submitted_at
        if front is not None and front < mine:
            values["queue_at"] = front - AHEAD_S
            said.append("moved to the top of its user's queue")
    return values, said
