"""Jobs as clients see them: submit, read, list, cancel, interrupt, results.

Every method takes the ``Principal`` and enforces what it may see: a team
token never learns that another team's job exists (it gets 404, as for an
unknown id).

Over 400 lines on purpose: a client's whole view of jobs (submission with its checks, reads,
lists, cancel, interrupt, results) behind one permission rule; pipelines, edits and
deletion live apart (``pipelines``, ``queue_edits``, ``forget``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import (
    Conflict,
    Forbidden,
    InvalidSpec,
    LimitReached,
    NotFound,
    QuotaExceeded,
)
from corral.core.events import EventKind
from corral.core.model import Job
from corral.core.states import JOB, JobState, StopReason, transition
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.checkpoints import drop_after_commit
from corral.server.services.dependencies import (
    Group,
    check_dependencies,
    field_prefix,
    insert_links,
)
from corral.server.services.forget import forget
from corral.server.services.group import GroupCommitter
from corral.server.services.inputs import InputService
from corral.server.services.policy import PolicyService
from corral.server.services.previews import preview_key
from corral.server.services.quotas import TeamQuotas
from corral.server.services.rates import RateLimits
from corral.server.services.settling import request_stop, stop_job
from corral.server.services.unit import Runtime, Tx
from corral.server.store import allocations as alloc_repo
from corral.server.store import job_search
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store.ids import sortable_id
from corral.server.store.job_search import JobFilter
from corral.server.store.records import JobRecord, ResultFile, Take, Webhook
from corral.server.store.retention import JobAge
from corral.server.webhook_urls import check_literal

_CURSOR = re.compile(r"s([0-9]{1,19})")
MAX_SEQ = 2**63 - 1
"""Sequence numbers are 64-bit signed integers on both databases."""


def new_job_id() -> str:
    return sortable_id("job_")


@dataclass(frozen=True, slots=True)
class Draft:
    """A validated job to submit and a hash of the request that produced it.

    The hash is only needed (and only taken) when the job has an idempotency key.
    """

    job: Job
    request_hash: str | None
    labels: Mapping[str, str] = field(default_factory=dict)  # the client's own tags
    webhook: Webhook | None = None
    # Pipelines and arrays (services/dependencies.py): the jobs it runs after as (id, need),
    # with the field of the request that named each (a 422 names it); the result files of
    # others it reads; its pipeline or array and its step name or index there.
    after: tuple[tuple[str, str, str], ...] = ()
    takes: tuple[Take, ...] = ()
    group_id: str | None = None
    member: str | None = None

    def record(self, now: float) -> JobRecord:
        """The job's row as inserted: waiting while it runs after others, else queued."""
        state = JobState.WAITING if self.after else self.job.state
        return JobRecord(
            job=replace(self.job, submitted_at=now, state=state),
            request_hash=self.request_hash,
            labels=self.labels,
            webhook=self.webhook,
            after=tuple((dep, need) for dep, need, _ in self.after),
            takes=self.takes,
            group_id=self.group_id,
            member=self.member,
        )


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[JobRecord]
    next_cursor: str | None


class JobService:
    def __init__(
        self,
        rt: Runtime,
        group: GroupCommitter,
        rates: RateLimits,
        quotas: TeamQuotas,
        inputs: InputService | None = None,
        policy: PolicyService | None = None,
    ) -> None:
        self.rt = rt
        self.inputs = inputs or InputService(rt)  # checks the files jobs name are theirs
        self.group = group  # concurrent submissions share a commit, with agents' updates too
        self.rates = rates
        self.quotas = quotas
        self.policy = policy or PolicyService(rt)  # classes, who may use them, caps

    async def submit(
        self, who: Principal, drafts: Sequence[Draft], group: Group | None = None
    ) -> tuple[list[JobRecord], bool]:
        """Create the jobs atomically (all or none); concurrent calls share one commit.

        Returns the jobs and whether they were created (False: every job was
        already there under the same idempotency keys: a replay). ``group``: the
        pipeline or array they form, inserted with them.

        A team token's submission first passes its rate limit (``RateLimits``) and its
        team's caps (``TeamQuotas``); a replay of jobs already made passes the caps.
        """
        who.require_client()
        self._check(who, drafts)
        drafts, counts = await self._entitled(who, drafts)
        await self._check_inputs(who, drafts)
        await check_dependencies(self.rt, who, drafts)
        self.rates.submit(who, len(drafts))
        try:
            await self.policy.check_queued(who, counts)
            async with self.quotas.admit(who, len(drafts)) as admission:
                records, created = await self.group.run(lambda tx: self._insert(tx, drafts, group))
                admission.created = created
        except (LimitReached, QuotaExceeded):
            async with self.rt.db.read() as conn:
                replayed = await self._replays(conn, drafts)
            if replayed is None:
                raise
            return replayed, False
        if created:
            self.rt.known_teams |= {r.job.team for r in records}
            for r in records:
                self.rt.metrics.submitted.labels(r.job.priority, r.job.team).inc()
        return records, created

    async def _insert(
        self, tx: Tx, drafts: Sequence[Draft], group: Group | None = None
    ) -> tuple[list[JobRecord], bool]:
        """One submission inside a (group) transaction: replay, or insert with events."""
        existing = await self._replays(tx.conn, drafts)
        if existing is not None:
            return existing, False
        records = [d.record(tx.now) for d in drafts]
        await job_repo.insert_many(tx.conn, records)
        if await insert_links(tx, records, group):
            self.rt.deps_waiting = True
            tx.at_commit(self._release)  # what they wait for may have ended already
        tx.reschedule = True  # new work: the scheduling loop must see it
        teams = {r.job.team for r in records}
        if not teams <= self.rt.known_teams:
            await node_repo.ensure_teams(tx.conn, teams - self.rt.known_teams, tx.now)
        for r in records:
            tx.emit(EventKind.JOB_SUBMITTED, team=r.job.team, job_id=r.job.id, state=r.state.value)
        return records, True

    async def _release(self) -> None:
        self.rt.release_needed.fire()

    def _check(self, who: Principal, drafts: Sequence[Draft]) -> None:
        for i, d in enumerate(drafts):
            prefix = field_prefix(drafts, i)
            if not who.sees(d.job.team):
                raise Forbidden(
                    f"a token of team {who.team!r} cannot submit jobs for team {d.job.team!r}"
                )
            if d.webhook is not None:
                try:
                    check_literal(d.webhook.url, self.rt.settings.webhooks.allow_private)
                except InvalidSpec as e:
                    raise InvalidSpec(f"{prefix}{e.field}", e.message) from None

    async def _entitled(
        self, who: Principal, drafts: Sequence[Draft]
    ) -> tuple[Sequence[Draft], dict[tuple[str, str], int]]:
        """Each job's class must be one the policy lets its team or user use (403 naming
        class and team); a job without a time limit gets its class's default one. Also
        the new jobs per (team, user), for the policy's caps on queued jobs."""
        out, counts = [], defaultdict[tuple[str, str], int](int)
        for i, d in enumerate(drafts):
            job = d.job
            field = f"{field_prefix(drafts, i)}priority"
            await self.policy.entitle(who, job.team, job.user, job.priority, field)
            counts[(job.team, job.user)] += 1
            rule = self.policy.current.rule(job.priority)
            limit = rule.default_time_limit_s if rule is not None else None
            if job.timeout_s is None and limit is not None:
                d = replace(d, job=replace(job, timeout_s=limit))
            out.append(d)
        return out, counts

    async def _check_inputs(self, who: Principal, drafts: Sequence[Draft]) -> None:
        """Every input file a job names must be one its submitter uploaded (422 otherwise)."""
        cap = self.rt.settings.inputs.max_per_job
        for i, d in enumerate(drafts):
            field = f"{field_prefix(drafts, i)}inputs"
            if len(d.job.inputs) > cap:
                raise InvalidSpec(field, f"at most {cap} input files a job (inputs.max_per_job)")
            await self.inputs.check(who, d.job.inputs, field)

    async def _replays(
        self, conn: AsyncConnection, drafts: Sequence[Draft]
    ) -> list[JobRecord] | None:
        """The jobs already submitted under these idempotency keys, if every one was."""
        by_team: dict[str, list[str]] = defaultdict(list)
        for d in drafts:
            if d.job.idempotency_key:
                by_team[d.job.team].append(d.job.idempotency_key)
        found: dict[tuple[str, str], JobRecord] = {}
        for team, keys in by_team.items():
            for key, rec in (await job_repo.by_idempotency_keys(conn, team, keys)).items():
                found[(team, key)] = rec
        if not found:
            return None
        replayed = [found.get((d.job.team, d.job.idempotency_key or "")) for d in drafts]
        for d, hit in zip(drafts, replayed, strict=True):
            if hit is None or hit.request_hash != d.request_hash:
                raise Conflict(
                    f"Idempotency-Key {d.job.idempotency_key!r} was already used for a different "
                    "request; use a new key for new work"
                )
        return [r for r in replayed if r is not None]

    async def get(self, who: Principal, job_id: str) -> JobRecord:
        who.require_client()
        async with self.rt.db.read() as conn:
            rec = await job_repo.get(conn, job_id)
        if rec is None or not who.sees(rec.job.team):
            raise NotFound(f"job {job_id} not found")
        return rec

    async def page(
        self,
        who: Principal,
        *,
        states: Sequence[JobState] = (),
        team: str | None = None,
        user: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        where: JobFilter | None = None,
    ) -> Page:
        """Jobs newest first, ``limit`` at a time; ``next_cursor`` fetches the next page.
        ``where`` adds the jobs list's other filters (kind, node, time, id prefix ...)."""
        who.require_client()
        if not who.is_admin:
            if team is not None and team != who.team:
                raise Forbidden(f"a token of team {who.team!r} cannot list team {team!r}")
            team = who.team
        before = decode_cursor(cursor) if cursor else None
        f = replace(where or JobFilter(), states=states, team=team, user=user)
        async with self.rt.db.read() as conn:
            recs = await job_search.page(conn, f, before_seq=before, limit=limit + 1)
        more = len(recs) > limit
        recs = recs[:limit]
        return Page(recs, encode_cursor(recs[-1].seq) if more and recs else None)

    async def cancel(self, who: Principal, job_id: str) -> JobRecord:
        """Cancel: the job ends now; if it was placed or running, its work is told to stop."""
        return await self._stop(who, job_id, StopReason.CANCEL)

    async def interrupt(self, who: Principal, job_id: str) -> JobRecord:
        """Stop early and keep what was produced: a running job ends when the agent reports."""
        return await self._stop(who, job_id, StopReason.INTERRUPT)

    async def _stop(self, who: Principal, job_id: str, reason: StopReason) -> JobRecord:
        await self.get(who, job_id)  # visibility and 404 before taking the write lock
        async with self.rt.tx(reschedule=True) as tx:
            rec = await job_repo.get(tx.conn, job_id)
            if rec is None:  # the retention sweep deleted it meanwhile (it had long ended)
                raise NotFound(f"job {job_id} not found")
            if rec.state in JOB.terminal:
                if rec.state is JobState.CANCELLED:
                    return rec  # cancelling twice is harmless
                raise Conflict(f"job {job_id} already {rec.state.value}; nothing to stop")
            if reason is StopReason.INTERRUPT and rec.state is JobState.RUNNING:
                await self._interrupt_running(tx, rec)
            else:
                await self._cancel_now(tx, rec, reason)
            detail = {"team": rec.job.team, "state": rec.state.value}
            await audit.record(tx, who, f"job.{reason.value}", job_id, detail)
            updated = await job_repo.get(tx.conn, job_id)
        assert updated is not None
        return updated

    async def _cancel_now(self, tx: Tx, rec: JobRecord, reason: StopReason) -> None:
        target = transition(
            JOB, rec.job.id, rec.state, JobState.CANCELLED, at=tx.now, why=reason.value
        )
        interrupted = reason is StopReason.INTERRUPT
        error = "interrupted before it started" if interrupted else "cancelled"
        ok = await job_repo.update(
            tx.conn,
            rec,
            state=target.value,
            finished_at=tx.now,
            error=error,
            stop_request=reason.value,
            interrupted=interrupted,
        )
        if not ok:
            raise Conflict(f"job {rec.job.id} changed while cancelling it; retry")
        drop_after_commit(self.rt, tx, rec.checkpoint)  # a requeued job may have one
        self.rt.metrics.finished.labels(target.value).inc()
        tx.emit(
            EventKind.JOB_CANCELLED,
            team=rec.job.team,
            job_id=rec.job.id,
            state=target.value,
            error=error,
            data={"interrupted": True} if interrupted else None,
        )
        await self._stop_allocations(tx, rec, StopReason.CANCEL)

    async def _interrupt_running(self, tx: Tx, rec: JobRecord) -> None:
        if not await job_repo.update(tx.conn, rec, stop_request=StopReason.INTERRUPT.value):
            raise Conflict(f"job {rec.job.id} changed while interrupting it; retry")
        tx.emit(
            EventKind.JOB_LOG, team=rec.job.team, job_id=rec.job.id, lines=["interrupt requested"]
        )
        await self._stop_allocations(tx, rec, StopReason.INTERRUPT)

    async def _stop_allocations(self, tx: Tx, rec: JobRecord, reason: StopReason) -> None:
        """Stop each allocation of ``rec`` whose every job now wants to stop (batches share
        one); in a batch whose other jobs run on, stop just this job."""
        grace = self.rt.settings.scheduling.stop_grace_s
        for alloc_id in rec.allocation_ids:
            alloc = await alloc_repo.get(tx.conn, alloc_id)
            if alloc is None or not alloc.alloc.active:
                continue
            others = await job_repo.get_many(
                tx.conn, [j for j in alloc.alloc.job_ids if j != rec.job.id]
            )
            if all(o.state in JOB.terminal or o.stop_request for o in others.values()):
                await request_stop(self.rt, tx, alloc, reason, grace)
            else:
                stop_job(self.rt, tx, alloc, rec.job.id, reason, grace)

    async def delete(self, who: Principal, job_id: str) -> None:
        """Delete a finished job with its events, results and previews (``forget``); a job
        still queued or running must be cancelled first (409)."""
        rec = await self.get(who, job_id)  # visibility and 404
        if rec.state not in JOB.terminal:
            raise Conflict(f"job {job_id} is {rec.state.value}: cancel it first, then delete it")
        await forget(self.rt, [JobAge.of(rec)], by=who)  # finished: nothing changes it meanwhile

    async def result_ref(self, who: Principal, job_id: str, name: str) -> ResultFile:
        """The descriptor of one result file of a job visible to ``who``."""
        rec = await self.get(who, job_id)
        for f in rec.result:
            if f.name == name:
                return f
        raise NotFound(f"job {job_id} has no result file {name!r}")

    async def result_file(self, who: Principal, job_id: str, name: str) -> tuple[ResultFile, bytes]:
        f = await self.result_ref(who, job_id, name)
        if f.inline is not None:
            return f, f.inline
        return f, await self.rt.blobs.get(f.key)

    async def preview(self, who: Principal, job_id: str, key: str) -> bytes:
        await self.get(who, job_id)
        return await self.rt.blobs.get(preview_key(job_id, key))


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"s{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The job sequence number a cursor holds; anything ``encode_cursor`` did not make is a
    422 naming the field (a number past 64 bits would reach the database as an overflow)."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        text = ""
    match = _CURSOR.fullmatch(text)
    if match is None or int(match.group(1)) > MAX_SEQ:
        raise InvalidSpec("cursor", "not a cursor returned by this API (use next_cursor as given)")
    return int(match.group(1))
