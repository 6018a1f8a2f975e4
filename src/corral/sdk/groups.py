"""Pipelines and job arrays: jobs submitted, followed and cancelled as one (docs/sdk.md).

``Client.submit_pipeline`` sends a small DAG of named steps (each a job whose
``after``, ``after_any`` and ``inputs: [{"from": step, "file": ..., "as": ...}]``
name other steps) and ``Client.submit_array`` N copies of one job, each with its
index. Either may name its own ``webhook`` (``{"url": ..., "events": "end"|"all"}``),
called when every job of it has ended. Both give a ``Group``: ``follow()`` yields its
status as it changes, ``wait()`` returns it once every job ended, ``cancel()`` and
``reprioritise()`` act on all its jobs, ``deliveries()`` lists its webhook's calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from pydantic import Field

from corral.sdk.calls import Call, _deliveries, _model, _seg, make_spec
from corral.sdk.errors import WaitTimeout
from corral.sdk.handle import AsyncHandle, Handle
from corral.sdk.models import Delivery, JobSpec, JobStatus, _Out

POLL_S = 1.0  # how often ``follow`` asks again: a group's state is its jobs', read whole


class StepStatus(_Out):
    name: str
    job_id: str
    state: str
    after: list[str] = Field(default_factory=list)  # the steps it runs after: the graph
    progress: float = 0.0
    error: str | None = None


class GroupStatus(_Out):
    """A pipeline or array as the server last saw it."""

    id: str
    kind: str
    state: str  # running, then succeeded, failed or cancelled
    team: str
    user: str
    size: int
    created_at: float
    progress: float = 0.0
    counts: dict[str, int] = Field(default_factory=dict)
    steps: list[StepStatus] | None = None
    webhook: dict[str, str] | None = None  # its own: url and events
    jobs: list[JobStatus] = Field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.state != "running"

    def step(self, name: str) -> JobStatus:
        """A pipeline step's job by the step's name."""
        for s in self.steps or ():
            if s.name == name:
                return next(j for j in self.jobs if j.id == s.job_id)
        raise KeyError(name)


def _path(kind: str, group_id: str = "") -> str:
    return f"/v1/{kind}s" + (f"/{_seg(group_id)}" if group_id else "")


def kind_of(group_id: str) -> str:
    return "pipeline" if group_id.startswith("pipe_") else "array"


def submit_pipeline(
    steps: Mapping[str, JobSpec | Mapping[str, Any]],
    team: str | None,
    key: str,
    webhook: Mapping[str, str] | None = None,
) -> Call[GroupStatus]:
    """Each step checked locally first (a typo names ``steps.<name>.<field>``)."""
    body: dict[str, Any] = {"steps": {}}
    for name, spec in steps.items():
        fields = dict(spec) if isinstance(spec, Mapping) else spec.body()
        outputs = fields.pop("outputs", None)  # a step's own field, not a job's
        step = make_spec(fields, {}, f"steps.{name}.").body()
        body["steps"][name] = step if outputs is None else {**step, "outputs": list(outputs)}
    if team is not None:
        body["team"] = team
    if webhook is not None:
        body["webhook"] = dict(webhook)
    headers = {"Idempotency-Key": key}  # a retried request returns the same pipeline
    return Call("POST", "/v1/pipelines", _model(GroupStatus), json=body, headers=headers)


def submit_array(
    job: JobSpec | Mapping[str, Any],
    count: int,
    index_key: str,
    index_start: int,
    key: str,
    webhook: Mapping[str, str] | None = None,
) -> Call[GroupStatus]:
    body: dict[str, Any] = {
        "job": make_spec(job, {}, "job.").body(),
        "count": count,
        "index_key": index_key,
        "index_start": index_start,
    }
    if webhook is not None:
        body["webhook"] = dict(webhook)
    headers = {"Idempotency-Key": key}  # a retried request returns the same array
    return Call("POST", "/v1/arrays", _model(GroupStatus), json=body, headers=headers)


def get(group_id: str) -> Call[GroupStatus]:
    return Call("GET", _path(kind_of(group_id), group_id), _model(GroupStatus))


def cancel(group_id: str) -> Call[GroupStatus]:
    return Call("POST", _path(kind_of(group_id), group_id) + "/cancel", _model(GroupStatus))


def reprioritise(group_id: str, priority: str) -> Call[GroupStatus]:
    path = _path(kind_of(group_id), group_id)
    return Call("PATCH", path, _model(GroupStatus), json={"priority": priority})


def deliveries(group_id: str, limit: int = 100) -> Call[list[Delivery]]:
    path = _path(kind_of(group_id), group_id) + "/deliveries"
    return Call("GET", path, _deliveries, params=[("limit", limit)])


def listing(kind: str, limit: int) -> Call[list[GroupStatus]]:
    def parse(body: Any) -> list[GroupStatus]:
        return [GroupStatus.model_validate(g) for g in body["items"]]

    return Call("GET", _path(kind), parse, params=[("limit", limit)])


class Group(Handle[GroupStatus]):
    """A submitted pipeline or array. ``status`` is what the server said last."""

    def _state(self) -> str:
        return self.status.state

    def _get(self) -> Call[GroupStatus]:
        return get(self.id)

    def follow(self, *, poll_s: float = POLL_S) -> Iterator[GroupStatus]:
        """Its status each time a job's state or the progress changed, until every job ended."""
        seen: tuple[Any, ...] | None = None
        while True:
            status = self.refresh()
            now = (status.counts, round(status.progress, 3))
            if now != seen:
                seen = now
                yield status
            if status.done:
                return
            time.sleep(poll_s)

    def wait(self, timeout: float | None = None, *, poll_s: float = POLL_S) -> GroupStatus:
        """Block until every job ended; ``WaitTimeout`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for status in self.follow(poll_s=poll_s):
            if status.done:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(self.id, timeout or 0.0, status.state)
        return self.status

    def cancel(self) -> GroupStatus:
        """Cancel every job of it that has not ended."""
        self.status = self.client.run(cancel(self.id))
        return self.status

    def reprioritise(self, priority: str) -> GroupStatus:
        """Move its jobs not yet placed to priority class ``priority``."""
        self.status = self.client.run(reprioritise(self.id, priority))
        return self.status

    def deliveries(self, limit: int = 100) -> list[Delivery]:
        """Its own webhook's calls (its end; ``events: all``: its jobs' changes too), each
        with its attempts, oldest first."""
        return self.client.run(deliveries(self.id, limit))


class AsyncGroup(AsyncHandle[GroupStatus]):
    """``Group`` for asyncio code (``AsyncClient.submit_pipeline`` ...): the same, awaited."""

    def _state(self) -> str:
        return self.status.state

    def _get(self) -> Call[GroupStatus]:
        return get(self.id)

    async def follow(self, *, poll_s: float = POLL_S) -> AsyncIterator[GroupStatus]:
        """Its status each time a job's state or the progress changed, until every job ended."""
        seen: tuple[Any, ...] | None = None
        while True:
            status = await self.refresh()
            now = (status.counts, round(status.progress, 3))
            if now != seen:
                seen = now
                yield status
            if status.done:
                return
            await asyncio.sleep(poll_s)

    async def wait(self, timeout: float | None = None, *, poll_s: float = POLL_S) -> GroupStatus:
        """Until every job ended; ``WaitTimeout`` after ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                async for status in self.follow(poll_s=poll_s):
                    if status.done:
                        return status
        except TimeoutError:
            raise WaitTimeout(self.id, timeout or 0.0, self.status.state) from None
        return self.status

    async def cancel(self) -> GroupStatus:
        self.status = await self.client.run(cancel(self.id))
        return self.status

    async def reprioritise(self, priority: str) -> GroupStatus:
        self.status = await self.client.run(reprioritise(self.id, priority))
        return self.status

    async def deliveries(self, limit: int = 100) -> list[Delivery]:
        return await self.client.run(deliveries(self.id, limit))
