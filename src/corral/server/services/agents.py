"""The inbound side of the agent link: what agents tell the server (``AgentInbound``).

Every allocation update names the allocation and its attempt. An update is
applied only when the allocation is on the sender's node, its attempt is the
one the server knows, and (for anything touching a job) the job still points
at it: the fencing rule of ``settling.is_current``. Late messages from an
older attempt (a node that came back after its work was requeued) are
answered ``STALE`` and change nothing.

Over 400 lines on purpose: every message an agent sends is applied here under the one
fencing rule; the rules that stand alone live apart (``settling``, ``departure``,
``attempts``, ``lacking``, ``stragglers``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from corral.core.errors import Conflict, LinkError
from corral.core.events import EventKind
from corral.core.model import EMPTY, Allocation, Gpu
from corral.core.states import (
    ALLOCATION,
    UNSTARTED,
    AllocDesired,
    AllocObserved,
    JobState,
    NodeState,
    transition,
)
from corral.server.agentlink.base import (
    Ack,
    HelloReply,
    Inventory,
    ResultBlob,
    Running,
    Standing,
)
from corral.server.services.auth import AuthService
from corral.server.services.checkpoints import drop_after_commit, drop_uploads, may_fetch
from corral.server.services.gang_start import mark_ready
from corral.server.services.group import GroupCommitter
from corral.server.services.inputs import InputService, input_sha
from corral.server.services.node_join import reconcile, upsert_node
from corral.server.services.node_keys import may_hold, taken
from corral.server.services.outcomes import Ending
from corral.server.services.previews import keep_latest, preview_key
from corral.server.services.results import Files, apart, cut_batch, inline_results, store_results
from corral.server.services.sessions import AgentAdmission
from corral.server.services.settling import Said, end_allocation, is_current, record_start
from corral.server.services.unit import Runtime, Tx
from corral.server.services.upload_rights import upload_standing
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import AllocRecord, JobRecord

MAX_LOG_LINES = 200
MAX_LOG_LINE = 4096
_EXT = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp", "image/gif": ".gif"}


class AgentService:
    """Implements ``corral.server.agentlink.base.AgentInbound``."""

    def __init__(self, rt: Runtime, auth: AuthService, group: GroupCommitter) -> None:
        self.rt = rt
        self.auth = auth
        self._written_seen: dict[str, float] = {}  # last heartbeat written, per node
        # Allocation updates from every agent share transactions (one fsync per group), with
        # submissions too: the plane hands both services its one committer. Starts,
        # progress, previews and logs need no fsync of their own (see Database.write); ends,
        # results and checkpoints do, before the agent's ack; their events go out at the
        # commit (``early``: the agent keeps the report until that ack; docs/server.md).
        self.updates = group

    async def authenticate(self, token: str) -> AgentAdmission:
        return await self.auth.admit_agent(token)

    @property
    def heartbeat_s(self) -> float:
        return min(5.0, self.rt.settings.scheduling.node_timeout_s / 3)

    async def claim(self, node: str, key: str) -> None:
        async with self.rt.db.read() as conn:
            rec = await node_repo.get(conn, node)
        if rec is not None and not may_hold(rec, key):
            raise Conflict(taken(node))

    async def hello(self, inventory: Inventory, running: Sequence[Running]) -> HelloReply:
        """Register or refresh the node, then reconcile what it runs with what the server wants."""
        name, s = inventory.node, self.rt.settings
        cap, retry_s = s.agents.max_nodes_per_token, s.scheduling.node_timeout_s
        async with self.rt.tx(reschedule=True) as tx:
            node = await upsert_node(tx, inventory, cap, retry_s)
            reported = {r.allocation_id: r.attempt for r in running}
            assign, stop = await reconcile(self.rt, tx, name, reported)
        self._written_seen[name] = tx.now
        return HelloReply(
            assign=tuple(assign),
            stop=tuple(stop),
            intake_open=not (node.paused or node.draining),
            heartbeat_s=self.heartbeat_s,
        )

    async def heartbeat(self, node: str, gpus: Sequence[Gpu] | None = None) -> None:
        """Note that ``node`` is alive. Written at most every few seconds per node."""
        now = self.rt.clock.now()
        if now - self._written_seen.get(node, 0.0) < min(
            5.0, self.rt.settings.scheduling.node_timeout_s / 4
        ):
            return
        async with self.rt.db.write(ordered_events=False) as conn:
            rec = await node_repo.get(conn, node)
            if rec is None or rec.node.state is NodeState.LOST:
                raise LinkError(f"node {node} is unknown or was marked lost: say hello again")
            await node_repo.touch(conn, node, now, gpus)
        self._written_seen[node] = now

    async def started(self, node: str, allocation_id: str, attempt: int) -> Ack:
        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt)
            if isinstance(rec, Ack):
                return rec
            if rec.alloc.observed not in UNSTARTED:
                return Ack.DUPLICATE
            jobs = await job_repo.get_many(tx.conn, rec.alloc.job_ids)
            timeouts = [j.job.timeout_s for j in jobs.values() if j.job.timeout_s]
            observed = transition(
                ALLOCATION,
                allocation_id,
                rec.alloc.observed,
                AllocObserved.RUNNING,
                at=tx.now,
                why="started",
            )
            deadline = tx.now + min(timeouts) if timeouts else None
            estimates = [j.job.estimated_runtime_s for j in jobs.values()]
            known = [e for e in estimates if e]
            await alloc_repo.update(
                tx.conn,
                rec,
                observed=observed.value,
                started_at=tx.now,
                deadline_at=deadline,
                expected_end_at=tx.now + max(known) if known else None,
            )
            for job in jobs.values():
                if is_current(job, rec.alloc) and job.state is JobState.PLACED:
                    await self._start_job(tx, job)
            return Ack.ACCEPTED

        return await self.updates.run(unit, durable=False)

    async def ready(self, node: str, allocation_id: str, attempt: int) -> Ack:
        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt)
            return rec if isinstance(rec, Ack) else await mark_ready(self.rt, tx, rec)

        return await self.updates.run(unit)

    async def _start_job(self, tx: Tx, job: JobRecord) -> None:
        running = record_start(self.rt, tx, job)
        await job_repo.update(tx.conn, job, state=running.value, started_at=tx.now)

    async def progress(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        fraction: float,
        *,
        job_id: str | None = None,
        message: str | None = None,
    ) -> Ack:
        fraction = min(1.0, max(0.0, fraction))

        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt)
            if isinstance(rec, Ack):
                return rec
            await alloc_repo.update(tx.conn, rec, progress=fraction)
            for job in await self._current_jobs(tx, rec, job_id):
                await job_repo.update(tx.conn, job, progress=fraction)
                data = {"progress": fraction} | (
                    {"message": message[:MAX_LOG_LINE]} if message else {}
                )
                tx.emit(EventKind.JOB_PROGRESS, team=job.job.team, job_id=job.job.id, data=data)
            return Ack.ACCEPTED

        return await self.updates.run(unit, durable=False)

    async def preview(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        job_id: str,
        data: bytes,
        content_type: str = "image/png",
    ) -> Ack:
        key = f"{attempt}-{secrets.token_hex(4)}{_EXT.get(content_type, '.bin')}"
        async with self.rt.db.read() as conn:
            pre = await self._fenced_read(conn, node, allocation_id, attempt)
        if isinstance(pre, Ack):
            return pre
        await self.rt.blobs.put(preview_key(job_id, key), data)

        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt)
            if isinstance(rec, Ack):
                return rec
            for job in await self._current_jobs(tx, rec, job_id):
                url = f"/v1/jobs/{job.job.id}/previews/{key}"
                tx.emit(
                    EventKind.JOB_PREVIEW,
                    team=job.job.team,
                    job_id=job.job.id,
                    url=url,
                    content_type=content_type,
                )
            return Ack.ACCEPTED

        ack = await self.updates.run(unit, durable=False)
        await keep_latest(self.rt, job_id)
        return ack

    async def log(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        lines: Sequence[str],
        *,
        job_id: str | None = None,
    ) -> Ack:
        kept = [line[:MAX_LOG_LINE] for line in lines[:MAX_LOG_LINES]]

        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt)
            if isinstance(rec, Ack):
                return rec
            for job in await self._current_jobs(tx, rec, job_id):
                tx.emit(EventKind.JOB_LOG, team=job.job.team, job_id=job.job.id, lines=kept)
            return Ack.ACCEPTED

        return await self.updates.run(unit, durable=False)

    async def checkpoint(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        ref: str,
        *,
        job_id: str | None = None,
        step: int = 0,
    ) -> Ack:
        """The latest checkpoint of the job(s): a path on shared storage or ``blob:<id>``."""
        ref, step = ref[:1024], max(0, step)

        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt)
            if isinstance(rec, Ack):
                return rec
            if rec.alloc.replica != 0:
                # A gang keeps one checkpoint, rank 0's (it holds the whole model under DDP):
                # every rank resumes from it, so another rank's would only overwrite it.
                return Ack.ACCEPTED
            await alloc_repo.update(tx.conn, rec, last_checkpoint_at=tx.now)
            for job in await self._current_jobs(tx, rec, job_id, requeued=True):
                await job_repo.update(tx.conn, job, checkpoint=ref, checkpoint_step=step or None)
                if job.checkpoint != ref:  # the one it replaces is no use to anyone now
                    drop_after_commit(self.rt, tx, job.checkpoint)
                tx.emit(
                    EventKind.JOB_CHECKPOINT,
                    team=job.job.team,
                    job_id=job.job.id,
                    ref=ref,
                    step=step,
                )
            return Ack.ACCEPTED

        return await self.updates.run(unit, early=True)

    async def finished(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        results: Sequence[ResultBlob],
        *,
        stopped: Sequence[str] = (),
        modified: Mapping[str, str] = EMPTY,
    ) -> Ack:
        """Store the results, then end the allocation; only the current attempt counts.
        ``modified``: what the agent filled in or changed (kept as the jobs' ``ran``).

        Small results (all of them under ``results.INLINE_RESULT``) go into the job row with the
        end (durable with that commit, no read or blob file of their own); larger ones are
        written to the blob store first (an uploaded one linked there), after a fenced read.
        """
        done = AllocObserved.SUCCEEDED
        stored = await self._results_first(node, allocation_id, attempt, results, done)
        if isinstance(stored, Ack):
            return stored

        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt, done=AllocObserved.SUCCEEDED)
            if isinstance(rec, Ack):
                return rec
            files = stored if stored is not None else inline_results(rec, results)
            said = Said(files, endings=dict.fromkeys(stopped, Ending.STOPPED), modified=modified)
            await end_allocation(self.rt, tx, rec, Ending.SUCCEEDED, said=said)
            return Ack.ACCEPTED

        return await self.updates.run(unit, early=True)

    async def ran(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        results: Sequence[ResultBlob],
        *,
        stopped: Sequence[str] = (),
    ) -> tuple[Ack, Ack]:
        """``started`` then ``finished`` of work that ended at once (the agent sent both in
        one message): one unit, one fenced read, each row written once. Returns the two acks,
        as the two calls would have. Results too large for the job row take the two calls."""
        if apart(results):
            started = await self.started(node, allocation_id, attempt)
            return started, await self.finished(
                node, allocation_id, attempt, results, stopped=stopped
            )

        async def unit(tx: Tx) -> tuple[Ack, Ack]:
            rec = await self._fenced(tx, node, allocation_id, attempt, done=AllocObserved.SUCCEEDED)
            if isinstance(rec, Ack):  # a start of an allocation no longer active is stale
                return (Ack.STALE if rec is Ack.DUPLICATE else rec), rec
            starts = rec.alloc.observed in UNSTARTED
            files = inline_results(rec, results)
            said = Said(files, starts, dict.fromkeys(stopped, Ending.STOPPED))
            await end_allocation(self.rt, tx, rec, Ending.SUCCEEDED, said=said)
            return (Ack.ACCEPTED if starts else Ack.DUPLICATE), Ack.ACCEPTED

        return await self.updates.run(unit, early=True)

    async def failed(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        error: str,
        *,
        retryable: bool,
        job_id: str = "",
        finished: Sequence[str] = (),
        results: Sequence[ResultBlob] = (),
    ) -> Ack:
        done = AllocObserved.FAILED
        stored = await self._results_first(node, allocation_id, attempt, results, done)
        if isinstance(stored, Ack):
            return stored

        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt, done=done)
            if isinstance(rec, Ack):
                return rec
            # An allocation told to stop may report its end as a failure: it still obeyed the stop.
            ending = Ending.FAILED if rec.alloc.desired is AllocDesired.RUN else Ending.STOPPED
            files = stored if stored is not None else inline_results(rec, results)
            await end_allocation(
                self.rt,
                tx,
                rec,
                ending,
                retryable=retryable,
                error=error[:MAX_LOG_LINE],
                said=Said(files, endings=cut_batch(rec, finished, job_id)),
            )
            return Ack.ACCEPTED

        return await self.updates.run(unit, early=True)

    async def _results_first(
        self,
        node: str,
        allocation_id: str,
        attempt: int,
        results: Sequence[ResultBlob],
        done: AllocObserved,
    ) -> Files | Ack | None:
        """Results too large for the job row, stored before the end that names them (after
        a fenced read: its Ack if refused); None when every result rides in the row."""
        if not apart(results):
            return None
        async with self.rt.db.read() as conn:
            pre = await self._fenced_read(conn, node, allocation_id, attempt, done=done)
        if isinstance(pre, Ack):
            return pre
        return await store_results(self.rt, pre, results)

    async def stopped(self, node: str, allocation_id: str, attempt: int) -> Ack:
        async def unit(tx: Tx) -> Ack:
            rec = await self._fenced(tx, node, allocation_id, attempt, done=AllocObserved.STOPPED)
            if isinstance(rec, Ack):
                return rec
            await end_allocation(self.rt, tx, rec, Ending.STOPPED)
            return Ack.ACCEPTED

        return await self.updates.run(unit, early=True)

    async def may_fetch(self, allocation_id: str, attempt: int, blob_id: str) -> bool:
        sha = input_sha(blob_id)
        if sha is not None:  # an input file a job of the allocation names
            return await InputService(self.rt).may_fetch(allocation_id, attempt, sha)
        return await may_fetch(self.rt, allocation_id, attempt, blob_id)

    async def upload_standing(
        self, node: str, key: str, allocation_id: str, attempt: int
    ) -> Standing:
        return await upload_standing(self.rt, node, key, allocation_id, attempt)

    async def uploads_read(self, allocation_id: str, blob_ids: Sequence[str]) -> None:
        await drop_uploads(self.rt, allocation_id, blob_ids)

    async def _fenced(
        self, tx: Tx, node: str, allocation_id: str, attempt: int, done: AllocObserved | None = None
    ) -> AllocRecord | Ack:
        hint = self.rt.placed_allocs.pop(allocation_id, None)  # the record as placed, if kept
        return await self._fenced_read(tx.conn, node, allocation_id, attempt, done=done, hint=hint)

    async def _fenced_read(
        self,
        conn: object,
        node: str,
        allocation_id: str,
        attempt: int,
        done: AllocObserved | None = None,
        hint: AllocRecord | None = None,
    ) -> AllocRecord | Ack:
        """The allocation if this update may change it, else the Ack that explains why not."""
        rec = await alloc_repo.get(conn, allocation_id, hint=hint)  # type: ignore[arg-type]
        if rec is None or rec.alloc.node != node:
            return Ack.UNKNOWN
        if rec.alloc.attempt != attempt:
            return Ack.STALE
        if not rec.alloc.active:
            return Ack.DUPLICATE if done is not None and rec.alloc.observed is done else Ack.STALE
        return rec

    async def _current_jobs(
        self, tx: Tx, rec: AllocRecord, job_id: str | None, *, requeued: bool = False
    ) -> list[JobRecord]:
        """The jobs ``rec`` may still change; ``requeued``: also those its attempt just
        requeued (a gang's rank 0 checkpointing while it is stopped: the next attempt
        resumes from that checkpoint)."""
        ids = [job_id] if job_id is not None else list(rec.alloc.job_ids)
        jobs = await job_repo.get_many(tx.conn, [i for i in ids if i in rec.alloc.job_ids])
        return [
            j
            for j in jobs.values()
            if is_current(j, rec.alloc) or (requeued and _requeued_by(j, rec.alloc))
        ]


def _requeued_by(job: JobRecord, alloc: Allocation) -> bool:
    """``job`` waits to be placed again after ``alloc``'s attempt, the latest it had (a
    requeued job forgets its allocations; its attempt moves on only when it is placed)."""
    return job.state is JobState.QUEUED and job.job.attempt == alloc.attempt
