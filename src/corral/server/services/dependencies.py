"""Jobs that run after others: the waiting state, and the pass that ends it.

A job submitted with ``after`` (its dependencies must succeed), ``after_any`` (they
must end, in any state) or inputs ``from`` another job's results is inserted
``waiting``, with a ``job_deps`` row per job it runs after. The scheduler never
sees it: the queue is the ``queued`` state. ``release_waiting`` decides each
waiting job whose dependencies have all ended:

* every one ended as needed: the files it reads from them become its input files
  (hard links of the result blobs under ``inputs/<sha256>``, as uploaded inputs
  are; the agent fetches them as it fetches those, or takes its own copy when it
  made them) and it enters the queue (``job.queued``);
* one it needs succeeded ended otherwise (failed for good, after its own retries,
  or cancelled), was deleted, or did not make a file it reads: it is cancelled
  with that reason, and so, in the next pass, are those that need it.

Where it runs: the files it reads were made on some machine, and moving them costs
their size over ``scheduling.input_move_bytes_per_s``. When the result files that
machine keeps (those uploaded as blobs, ``agent/produced.py``) are worth waiting for,
the job enters the queue held to that machine (a selector on its ``corral/node``
label, a "near" row here) for as long as moving them would take; then the pass lets
it go anywhere. The machine that just finished the step before is usually free, so
the step runs there at once, with no transfer at all.

A dependency that is requeued (a retryable failure, a lost node) has not ended:
the job keeps waiting. The pass runs when a job ends on this replica while jobs
wait (``Runtime.release_needed``) and every ``POLL_S`` for ends committed by
other replicas (``loops/dependencies.py``). Concurrent passes are harmless:
every change is a guarded update of a job still waiting.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from corral.core.errors import InvalidSpec, NotFound
from corral.core.events import EventKind
from corral.core.model import NODE_NAME_LABEL, InputFile
from corral.core.states import JOB, JobState, transition
from corral.server.blobs import StoredBlob
from corral.server.services.auth import Principal
from corral.server.services.inputs import blob_key
from corral.server.services.unit import Runtime, Tx
from corral.server.store import jobs as job_repo
from corral.server.store.records import JobRecord, ResultFile, Webhook, job_row
from corral.server.store.tables import inputs, job_deps, job_groups, jobs

if TYPE_CHECKING:
    from corral.server.services.jobs import Draft


def field_prefix(drafts: Sequence[Draft], i: int) -> str:
    """How a 422 names draft ``i``'s fields: ``steps.<name>.`` in a pipeline, ``job.`` in an
    array, ``jobs[i].`` in a batch, nothing for one job."""
    d = drafts[i]
    if d.group_id is not None:
        return f"steps.{d.member}." if d.group_id.startswith("pipe_") else "job."
    return f"jobs[{i}]." if len(drafts) > 1 else ""


log = logging.getLogger("corral.server.dependencies")

NEED_OK, NEED_ANY, NEAR = "ok", "any", "near"
KEPT_OVER = 1024 * 1024
"""Results an agent keeps for a next step on its machine: those it uploads as blobs, over
its inline limit (``LinkSettings.inline_bytes``, 1 MiB by default); smaller ones cost
nothing to move."""
MAX_ROWS = 5000
"""Open dependencies read by one pass: far more than the jobs one pass can move; the rest
wait for the next."""


@dataclass(frozen=True, slots=True)
class Group:
    """A pipeline or job array: jobs submitted together under one id."""

    id: str
    kind: str  # "pipeline" | "array"
    team: str
    user: str
    size: int
    webhook: Webhook | None = None  # the group's own: called when every job of it ended


async def check_dependencies(rt: Runtime, who: Principal, drafts: Sequence[Draft]) -> None:
    """Every job a draft runs after is one of the same submission or an existing job of
    its team; a file it reads from a job that has succeeded is one that job made. 422
    naming the field otherwise."""
    if not any(d.after for d in drafts):  # nearly every submission: nothing to look up
        return
    local = {d.job.id for d in drafts}
    outside = {dep for d in drafts for dep, _, _ in d.after if dep not in local}
    if not outside:
        return
    async with rt.db.read() as conn:
        found = await job_repo.get_many(conn, outside)
    for i, d in enumerate(drafts):
        prefix = "" if d.group_id else field_prefix(drafts, i)  # a pipeline's fields are whole
        fields = {dep: field for dep, _, field in d.after}
        for dep, _, field in d.after:
            rec = found.get(dep)
            if dep in local:
                continue
            if rec is None or not who.sees(rec.job.team):
                raise InvalidSpec(prefix + field, f"no job {dep!r}")
            if rec.job.team != d.job.team:
                raise InvalidSpec(prefix + field, "a job runs only after jobs of its own team")
        for t in d.takes:
            rec = found.get(t.job)
            if rec is None or rec.state is not JobState.SUCCEEDED or t.file is None:
                continue
            if not any(f.name == t.file for f in rec.result):
                made = ", ".join(f.name for f in rec.result) or "nothing"
                raise InvalidSpec(
                    prefix + fields[t.job], f"job {t.job} made no file {t.file!r} ({made})"
                )


async def insert_links(tx: Tx, records: Sequence[JobRecord], group: Group | None) -> bool:
    """The group row and the open dependencies of jobs just inserted; whether any waits."""
    if group is not None:
        await tx.conn.execute(
            sa.insert(job_groups).values(
                id=group.id,
                kind=group.kind,
                team=group.team,
                user=group.user,
                size=group.size,
                created_at=tx.now,
                webhook_url=group.webhook.url if group.webhook else None,
                webhook_events=group.webhook.events if group.webhook else None,
            )
        )
    rows = [
        {"job_id": r.job.id, "dep_id": dep, "need": need} for r in records for dep, need in r.after
    ]
    if rows:
        await tx.conn.execute(sa.insert(job_deps), rows)
    return bool(rows)


@dataclass(frozen=True, slots=True)
class Verdict:
    job_id: str
    queue: bool  # True: enter the queue; False: cancel with ``reason``
    reason: str = ""


async def release_waiting(rt: Runtime) -> tuple[int, float | None]:
    """Queue or cancel each waiting job whose dependencies have all ended, and let go of
    the holds past their time: how many jobs moved, and when the next hold ends."""
    waiter, dep = jobs.alias("waiter"), jobs.alias("dep")
    query = (
        sa.select(
            job_deps.c.job_id,
            job_deps.c.dep_id,
            job_deps.c.need,
            job_deps.c.until,
            waiter.c.state.label("waiter_state"),
            dep.c.state.label("dep_state"),
        )
        .select_from(
            job_deps.outerjoin(waiter, waiter.c.id == job_deps.c.job_id).outerjoin(
                dep, dep.c.id == job_deps.c.dep_id
            )
        )
        .order_by(job_deps.c.job_id)
        .limit(MAX_ROWS)
    )
    async with rt.db.read() as conn:
        rows = list(await conn.execute(query))
    rt.deps_waiting = bool(rows)
    by_job: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        if row.need == NEAR:
            continue
        by_job[row.job_id].append(row)
    moved = await _let_go(rt, [r for r in rows if r.need == NEAR])
    if len(rows) == MAX_ROWS:  # the last job's rows may be cut short: decide it next time
        by_job.pop(rows[-1].job_id, None)
    stale = [j for j, deps in by_job.items() if deps[0].waiter_state != JobState.WAITING.value]
    if stale:  # cancelled by its client, or deleted: its rows are no longer open
        async with rt.tx(durable=False) as tx:
            await tx.conn.execute(
                sa.delete(job_deps).where(job_deps.c.job_id.in_(stale), job_deps.c.need != NEAR)
            )
    for job_id, deps in by_job.items():
        if job_id in stale:
            continue
        verdict = decide(job_id, deps)
        if verdict is not None:
            try:
                moved += await _apply(rt, verdict)
            except Exception:  # one job's trouble must not hold the others: next pass
                log.exception("could not release waiting job %s", job_id)
    return moved, next_hold_end(rows)


def decide(job_id: str, deps: Sequence[Any]) -> Verdict | None:
    """What becomes of a waiting job, from its dependencies' states; None: it waits on."""
    for d in deps:
        if d.dep_state is None and d.need == NEED_OK:
            return Verdict(job_id, False, f"job {d.dep_id} it runs after no longer exists")
        if d.dep_state in (JobState.FAILED.value, JobState.CANCELLED.value) and d.need == NEED_OK:
            return Verdict(job_id, False, f"job {d.dep_id} it needs {d.dep_state}")
    terminal = {s.value for s in JOB.terminal}
    if all(d.dep_state is None or d.dep_state in terminal for d in deps):
        return Verdict(job_id, True)
    return None


async def _apply(rt: Runtime, verdict: Verdict) -> int:
    async with rt.db.read() as conn:
        rec = await job_repo.get(conn, verdict.job_id)
        if rec is None or rec.state is not JobState.WAITING:
            return 0
        sources = await job_repo.get_many(conn, [t.job for t in rec.takes])
    if not verdict.queue:
        return await _cancel(rt, rec, await _why(rt, rec, verdict.reason))
    files, missing = await _inputs(rt, rec, sources)
    if missing:
        return await _cancel(rt, rec, missing)
    near, hold_s = _nearest(rt, rec, sources)
    async with rt.tx(reschedule=True) as tx:
        now = await job_repo.get(tx.conn, rec.job.id)
        if now is None or now.state is not JobState.WAITING:
            return 0
        target = transition(JOB, rec.job.id, now.state, JobState.QUEUED, at=tx.now, why="ready")
        job = replace(now.job, inputs=(*now.job.inputs, *(f for f, _ in files)), state=target)
        if near is not None:
            job = replace(job, node_selector={**job.node_selector, NODE_NAME_LABEL: near})
        spec = job_row(replace(now, job=job))["spec"]
        if not await job_repo.update(tx.conn, now, state=target.value, spec=spec):
            return 0
        await _own(tx, f"team:{rec.job.team}", files)
        await tx.conn.execute(sa.delete(job_deps).where(job_deps.c.job_id == rec.job.id))
        if near is not None:
            row = {"job_id": rec.job.id, "dep_id": near, "need": NEAR, "until": tx.now + hold_s}
            await tx.conn.execute(sa.insert(job_deps).values(**row))
        data: dict[str, Any] = {"inputs": [f.name for f, _ in files]} if files else {}
        if near is not None:
            data |= {"near": near, "hold_s": round(hold_s, 3)}
        tx.emit(
            EventKind.JOB_QUEUED, team=rec.job.team, job_id=rec.job.id, state="queued", data=data
        )
    return 1


def _nearest(
    rt: Runtime, rec: JobRecord, sources: dict[str, JobRecord]
) -> tuple[str | None, float]:
    """The machine holding most of the bytes ``rec`` reads as results it kept (uploaded
    as blobs: inline ones are not worth keeping), and how long moving them would take."""
    held: dict[str, int] = defaultdict(int)
    if NODE_NAME_LABEL in rec.job.node_selector:  # its client chose the machine itself
        return None, 0.0
    for t in rec.takes:
        src = sources.get(t.job)
        if src is None or src.node is None:
            continue
        for f in src.result:
            if f.size > KEPT_OVER and (t.file is None or f.name == t.file):
                held[src.node] += f.size
    if not held:
        return None, 0.0
    node = max(held, key=lambda n: held[n])
    return node, held[node] / rt.settings.scheduling.input_move_bytes_per_s


async def _let_go(rt: Runtime, pins: Sequence[Any]) -> int:
    """End each hold past its time: a queued job's selector loses the ``corral/node`` it
    was held by, so it may run anywhere. A placed or running job keeps the row (its row is
    the agent's to change now) until it ends, or is requeued (its node lost: it must not
    wait for that node). A job that changed meanwhile keeps its hold until the next pass."""
    now, moved = rt.clock.now(), 0
    terminal = {s.value for s in JOB.terminal}
    for pin in pins:
        queued = pin.waiter_state == JobState.QUEUED.value
        ended = pin.waiter_state is None or pin.waiter_state in terminal
        if not (ended or (queued and pin.until <= now)):
            continue
        async with rt.tx(reschedule=queued) as tx:
            rec = await job_repo.get(tx.conn, pin.job_id) if queued else None
            if rec is not None and rec.state is JobState.QUEUED:
                selector = {k: v for k, v in rec.job.node_selector.items() if k != NODE_NAME_LABEL}
                spec = job_row(replace(rec, job=replace(rec.job, node_selector=selector)))["spec"]
                if not await job_repo.update(tx.conn, rec, spec=spec):
                    continue
            moved += 1
            await tx.conn.execute(
                sa.delete(job_deps).where(job_deps.c.job_id == pin.job_id, job_deps.c.need == NEAR)
            )
    return moved


def next_hold_end(rows: Sequence[Any]) -> float | None:
    """The earliest end of a hold of a queued job among ``rows`` (None: none)."""
    queued = JobState.QUEUED.value
    ends = [r.until for r in rows if r.need == NEAR and r.waiter_state == queued]
    return min(ends, default=None)


async def _why(rt: Runtime, rec: JobRecord, reason: str) -> str:
    """The reason, with the step's name and error of the dependency that ended it."""
    dep_id = reason.split()[1] if reason.startswith("job ") else ""
    async with rt.db.read() as conn:
        dep = await job_repo.get(conn, dep_id) if dep_id else None
    if dep is None:
        return reason
    step = f" (step {dep.member!r})" if dep.member and dep.group_id == rec.group_id else ""
    said = f": {dep.error}" if dep.error else ""
    return reason.replace(dep_id, dep_id + step, 1) + said


async def _inputs(
    rt: Runtime, rec: JobRecord, sources: dict[str, JobRecord]
) -> tuple[list[tuple[InputFile, ResultFile]], str]:
    """The input files ``rec`` reads from other jobs' results, each stored under
    ``inputs/<sha256>`` (a hard link of the result blob: no bytes copied); or why not."""
    out: list[tuple[InputFile, ResultFile]] = []
    for t in rec.takes:
        src = sources.get(t.job)
        made = [f for f in (src.result if src else ()) if t.file is None or f.name == t.file]
        if t.file is not None and not made:
            return [], f"job {t.job} made no file {t.file!r} for it to read"
        for f in made:
            try:
                await _store(rt, f)
            except NotFound:  # deleted with its job meanwhile
                return [], f"result file {f.name} of job {t.job} is gone"
            out.append((InputFile(t.as_name or f.name, f.sha256), f))
    return out, ""


async def _store(rt: Runtime, f: ResultFile) -> None:
    key = blob_key(f.sha256)
    if rt.blobs.path(key) is not None:
        return
    if f.inline is not None:
        await rt.blobs.put(key, f.inline)
        return
    await rt.blobs.link(StoredBlob(f.key, f.size, f.sha256), key)


async def _own(tx: Tx, owner: str, files: Sequence[tuple[InputFile, ResultFile]]) -> None:
    """Rows for the files, so the retention sweep of input files counts and ends them."""
    for named, f in {f.sha256: (i, f) for i, f in files}.values():
        held = await tx.conn.execute(
            sa.select(inputs.c.sha256).where(inputs.c.owner == owner, inputs.c.sha256 == f.sha256)
        )
        if held.first() is None:
            await tx.conn.execute(
                sa.insert(inputs).values(
                    owner=owner,
                    sha256=f.sha256,
                    size=f.size,
                    name=named.name,
                    mime=f.content_type[:128],
                    created_at=tx.now,
                    used_at=tx.now,
                )
            )


async def _cancel(rt: Runtime, rec: JobRecord, reason: str) -> int:
    """End a waiting job that can never run, with the reason: its own dependents follow."""
    async with rt.tx() as tx:
        now = await job_repo.get(tx.conn, rec.job.id)
        if now is None or now.state is not JobState.WAITING:
            return 0
        target = transition(JOB, rec.job.id, now.state, JobState.CANCELLED, at=tx.now, why=reason)
        ok = await job_repo.update(
            tx.conn, now, state=target.value, finished_at=tx.now, error=reason
        )
        if not ok:
            return 0
        await tx.conn.execute(sa.delete(job_deps).where(job_deps.c.job_id == rec.job.id))
        tx.emit(
            EventKind.JOB_CANCELLED,
            team=rec.job.team,
            job_id=rec.job.id,
            state=target.value,
            error=reason,
        )
    return 1
