"""Pipelines and job arrays: jobs submitted together under one id (docs/server.md).

A pipeline is a small DAG of steps named within the request; each step is a job
that may run after others and read their result files (``services/dependencies.py``).
``order_steps`` accepts or refuses it whole: an unknown name, a cycle, a file read
from a step that says it makes other files, each a 422 naming the step and field.
An array is N copies of one job differing by their index. Both are read,
cancelled and (arrays) reprioritised as one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from corral.core.errors import Conflict, InvalidSpec, NotFound
from corral.core.states import JOB, JobState
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.dependencies import Group
from corral.server.services.jobs import Draft, JobService
from corral.server.services.unit import Runtime
from corral.server.store import jobs as job_repo
from corral.server.store.ids import sortable_id
from corral.server.store.records import JobRecord, Webhook
from corral.server.store.tables import job_groups, jobs
from corral.server.webhook_urls import check_literal

MAX_STEPS = 64
"""Steps in one pipeline: a workflow of models and passes, not a way around batch caps."""
MAX_LISTED = 100


@dataclass(frozen=True, slots=True)
class StepRefs:
    """What one step names of the others: (reference, field) of each job it runs after,
    and (step, file, field) of each file it reads; ``outputs``: the files it says it makes
    (None: not said)."""

    after: Sequence[tuple[str, str]]
    reads: Sequence[tuple[str, str | None, str]]
    outputs: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class GroupView:
    group: Group
    created_at: float
    jobs: list[JobRecord]  # by step order or index

    @property
    def state(self) -> str:
        """running while any job has not ended; then failed, cancelled or succeeded."""
        return group_state(r.state for r in self.jobs)

    @property
    def progress(self) -> float:
        """Ended jobs count whole, the others by their reported progress."""
        if not self.jobs:
            return 0.0
        done = sum(1.0 if r.state in JOB.terminal else r.progress for r in self.jobs)
        return done / len(self.jobs)


def group_state(states: Iterable[JobState]) -> str:
    """A group's state from its jobs': running while any has not ended; then failed if
    any failed, else cancelled if any was cancelled, else succeeded."""
    seen = set(states)
    if seen - JOB.terminal:
        return "running"
    for end in (JobState.FAILED, JobState.CANCELLED):
        if end in seen:
            return end.value
    return JobState.SUCCEEDED.value


def order_steps(steps: Mapping[str, StepRefs]) -> list[str]:
    """The steps, each after those it runs after; InvalidSpec (``steps.<name>.<field>``)
    for a reference to no step (that is not a job id), a file a step does not make, or a
    cycle. References to ``job_...`` ids are existing jobs: the submission checks them."""
    for name, refs in steps.items():
        for ref, field in refs.after:
            if ref not in steps and not ref.startswith("job_"):
                known = ", ".join(sorted(steps))
                raise InvalidSpec(f"steps.{name}.{field}", f"no step {ref!r} (steps: {known})")
            if ref == name:
                raise InvalidSpec(f"steps.{name}.{field}", "a step cannot run after itself")
        for ref, file, field in refs.reads:
            made = steps[ref].outputs if ref in steps else None
            if file is not None and made is not None and file not in made:
                raise InvalidSpec(
                    f"steps.{name}.{field}",
                    f"step {ref!r} makes no file {file!r} (its outputs: {', '.join(made)})",
                )
    return _topological(steps)


def _topological(steps: Mapping[str, StepRefs]) -> list[str]:
    needs = {n: {r for r, _ in s.after if r in steps} for n, s in steps.items()}
    order: list[str] = []
    ready = [n for n in steps if not needs[n]]
    while ready:
        name = ready.pop(0)
        order.append(name)
        for other, wants in needs.items():
            if name in wants:
                wants.discard(name)
                if not wants:
                    ready.append(other)
    if len(order) < len(steps):
        stuck = next(n for n in steps if n not in order)
        cycle = _cycle_from(stuck, needs)
        raise InvalidSpec(f"steps.{cycle[0]}.after", "a cycle: " + " -> ".join(cycle))
    return order


def _cycle_from(start: str, needs: Mapping[str, set[str]]) -> list[str]:
    """A cycle among the steps left waiting, as names (the first repeated at the end)."""
    path, at = [start], start
    while True:
        at = sorted(needs[at])[0]
        if at in path:
            return [*path[path.index(at) :], at]
        path.append(at)


class PipelineService:
    def __init__(self, rt: Runtime, jobs: JobService) -> None:
        self.rt = rt
        self.jobs = jobs

    async def submit(
        self,
        who: Principal,
        kind: str,
        drafts: Sequence[Draft],
        team: str,
        user: str,
        webhook: Webhook | None = None,
    ) -> tuple[GroupView, bool]:
        """Submit the group's jobs (their ``group_id`` set) all or none; the group, and
        whether it was made (False: a replay of the same idempotency keys, the group then
        being the one those jobs belong to). ``webhook``: the group's own, called when
        every job of it has ended (``loops/webhooks.py``)."""
        group_id = drafts[0].group_id
        assert group_id is not None
        if webhook is not None:  # the same rules as a job's (422 naming webhook.url)
            check_literal(webhook.url, self.rt.settings.webhooks.allow_private)
        group = Group(group_id, kind, team, user, len(drafts), webhook)
        records, created = await self.jobs.submit(who, drafts, group)
        if not created:
            replayed = records[0].group_id
            if replayed is None or replayed[:4] != group_id[:4]:
                raise Conflict("the Idempotency-Key was already used for other jobs")
            return await self.get(who, replayed), False
        return GroupView(group, records[0].job.submitted_at, records), True

    async def get(self, who: Principal, group_id: str) -> GroupView:
        who.require_client()
        async with self.rt.db.read() as conn:
            query = sa.select(job_groups).where(job_groups.c.id == group_id)
            row = (await conn.execute(query)).first()
            if row is None or not who.sees(row.team):
                raise NotFound(f"{_what(group_id)} {group_id} not found")
            ids = [
                r.id
                for r in await conn.execute(
                    sa.select(jobs.c.id).where(jobs.c.group_id == group_id).order_by(jobs.c.seq)
                )
            ]
            found = await job_repo.get_many(conn, ids)
        hook = Webhook(row.webhook_url, row.webhook_events or "end") if row.webhook_url else None
        group = Group(row.id, row.kind, row.team, row.user, row.size, hook)
        return GroupView(group, row.created_at, [found[i] for i in ids if i in found])

    async def page(self, who: Principal, kind: str, limit: int = 50) -> list[GroupView]:
        """The newest groups of ``kind`` the caller sees, with their jobs."""
        who.require_client()
        query = sa.select(job_groups.c.id).where(job_groups.c.kind == kind)
        if not who.is_admin:
            query = query.where(job_groups.c.team == who.team)
        query = query.order_by(job_groups.c.created_at.desc()).limit(min(limit, MAX_LISTED))
        async with self.rt.db.read() as conn:
            ids = [r.id for r in await conn.execute(query)]
        return [await self.get(who, i) for i in ids]

    async def cancel(self, who: Principal, group_id: str) -> GroupView:
        """Cancel every job of the group that has not ended (the waiting ones first, so
        none is released meanwhile); the group as it is then."""
        view = await self.get(who, group_id)
        alive = [r for r in view.jobs if r.state not in JOB.terminal]
        alive.sort(key=lambda r: r.state is not JobState.WAITING)
        for rec in alive:
            with contextlib.suppress(Conflict, NotFound):  # it ended (or went) meanwhile
                await self.jobs.cancel(who, rec.job.id)
        return await self.get(who, group_id)

    async def reprioritise(self, who: Principal, group_id: str, priority: str) -> GroupView:
        """Move the group's jobs not yet placed to priority class ``priority``: one the
        policy lets their team and user use (403 naming class and team otherwise)."""
        view = await self.get(who, group_id)
        for team, user in sorted({(r.job.team, r.job.user) for r in view.jobs}):
            await self.jobs.policy.entitle(who, team, user, priority)
        open_states = (JobState.QUEUED, JobState.WAITING)
        async with self.rt.tx(reschedule=True) as tx:
            for rec in view.jobs:
                if rec.state not in open_states or rec.job.priority == priority:
                    continue
                now = await job_repo.get(tx.conn, rec.job.id)
                if now is not None and now.state in open_states:
                    await job_repo.update(tx.conn, now, priority=priority)
            detail = {"team": view.group.team, "priority": priority}
            await audit.record(tx, who, f"{view.group.kind}.reprioritise", group_id, detail)
        return await self.get(who, group_id)


def new_group_id(kind: str) -> str:
    return sortable_id("pipe_" if kind == "pipeline" else "arr_")


def _what(group_id: str) -> str:
    return "pipeline" if group_id.startswith("pipe_") else "array"
