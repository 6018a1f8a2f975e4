"""What the AUTOMATIC1111- and ComfyUI-compatible APIs share: callers, jobs, waiting.

A request through a drop-in API becomes an ordinary corral job (kind
``sample``, the backend's name) submitted with the caller's token, so it gets
the caller's team, a priority class, fair mixing, model-aware routing and
failover like any other job. The request then waits for the job here, by
following the job's events (``EventFeed``), so it works on every replica and
survives an agent dying mid-job (the job is requeued, the request waits on).

Who the caller is: the token (HTTP Basic password or Bearer) decides the team
and what may be seen; the Basic user name, when there is one, is the corral
``user``, so two people sharing a team token are still mixed fairly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from corral.core.errors import Conflict, InvalidSpec, Unavailable
from corral.core.events import Event
from corral.core.model import DEFAULT_TEAM, InputFile, Node
from corral.core.states import JOB, NodeState
from corral.server.api.schemas import JobIn
from corral.server.compat_settings import CompatSettings
from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal
from corral.server.services.feed import one_by_one
from corral.server.services.jobs import Draft, new_job_id
from corral.server.store.records import JobRecord

MAX_USER = 128  # JobIn.user's limit
OnEvent = Callable[[Event], Awaitable[None]]
Disconnected = Callable[[], Awaitable[bool]]


class Unservable(Unavailable):
    """No connected backend can serve this request (``status``: the HTTP status to answer)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Caller:
    """A verified caller of a drop-in API: whose token, and which user of it."""

    principal: Principal
    user: str

    @property
    def key(self) -> tuple[str, str]:
        """What per-caller state (chosen checkpoint, running request) is kept under."""
        return (self.principal.token_id, self.user)

    @property
    def team(self) -> str:
        return self.principal.team or DEFAULT_TEAM


def caller_for(principal: Principal, basic_user: str | None) -> Caller:
    """The caller: the Basic user name if one was sent, else the token's name."""
    user = (basic_user or "").strip() or principal.name or "anonymous"
    return Caller(principal, user[:MAX_USER])


def compat_settings(settings: object) -> CompatSettings:
    """The ``compat`` part of the server settings (defaults when absent)."""
    found = getattr(settings, "compat", None)
    return found if isinstance(found, CompatSettings) else CompatSettings()


@dataclass(frozen=True, slots=True)
class Submission:
    """One drop-in request as a job: what to run, where, and how to recognise a repeat."""

    backend: str
    payload: Mapping[str, Any]
    model: str | None = None
    kind: str = "sample"
    key: str | None = None  # idempotency key (ComfyUI's prompt_id)
    fingerprint: Any = None  # what makes a repeat "the same request" (default: the payload)
    priority: str | None = None
    resources: Mapping[str, Any] | None = None  # default: the settings' gpus and cpus
    max_attempts: int | None = None
    user: str | None = None  # default: the caller's
    inputs: tuple[InputFile, ...] = ()  # uploaded files the job reads (ComfyUI's uploads)


def _job_in(fields: dict[str, Any]) -> JobIn:
    """The submission, validated like ``POST /v1/jobs``; a bad value names its field."""
    try:
        return JobIn.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        where = "body" if where == "payload" else where.removeprefix("payload.")
        raise InvalidSpec(where, str(first.get("msg", "invalid"))) from None


class CompatJobs:
    """Submit drop-in requests as jobs and wait for them."""

    def __init__(self, plane: ControlPlane, settings: CompatSettings) -> None:
        self.plane = plane
        self.settings = settings

    def priority(self, caller: Caller, asked: str | None) -> str:
        """The class a request runs in: the header's, the team's, or the default."""
        if asked:
            return asked
        return self.settings.team_priority.get(caller.team, self.settings.priority)

    async def backend_nodes(self, caller: Caller, backend: str) -> list[Node]:
        """Connected nodes offering ``backend``; ``Unavailable`` (with the reason) if none."""
        views = await self.plane.nodes.listing(caller.principal)
        ready = [v.record.node for v in views if v.record.node.state is NodeState.READY]
        offering = [n for n in ready if backend in n.backends]
        if not offering:
            raise Unservable(
                f"no connected node offers the {backend} backend "
                f"({len(ready)} node(s) connected; start one with `corral agent --{backend} URL`)"
            )
        return offering

    async def resources(self, caller: Caller, backend: str) -> dict[str, Any]:
        """What a request asks for: ``compat.gpus`` and ``cpus`` when set; unset, one GPU
        when a node offering ``backend`` has GPUs (a CPU-only one takes it too when the
        class allows CPU offload), CPU slots when all are CPU-only, so a request never
        waits for a GPU that no node with its backend has."""
        cpus = self.settings.cpus
        if self.settings.gpus is not None:
            return {"gpus": self.settings.gpus, "cpus": cpus}
        nodes = await self.backend_nodes(caller, backend)
        if any(n.gpus for n in nodes):
            return {"gpus": 1, "cpus": cpus, "cpu_fallback": True}
        return {"gpus": 0, "cpus": cpus}

    async def submit(self, caller: Caller, sub: Submission) -> tuple[JobRecord, bool]:
        """The job for ``sub`` (created, or the one already made under the same key)."""
        resources = sub.resources or await self.resources(caller, sub.backend)
        spec = _job_in(
            {
                "kind": sub.kind,
                "backend": sub.backend,
                "payload": dict(sub.payload),
                "model": sub.model,
                "priority": self.priority(caller, sub.priority),
                "user": sub.user or caller.user,
                "resources": dict(resources),
                "max_attempts": sub.max_attempts or self.settings.max_attempts,
                "inputs": [{"blob": f.sha256, "name": f.name} for f in sub.inputs],
            }
        )
        job = spec.to_job(new_job_id(), team=caller.team, idempotency_key=sub.key)
        basis = sub.fingerprint if sub.fingerprint is not None else sub.payload
        files = [[f.name, f.sha256] for f in sub.inputs]  # other bytes: another request
        text = json.dumps([caller.team, sub.backend, sub.model, basis, *files], sort_keys=True)
        draft = Draft(job, hashlib.sha256(text.encode()).hexdigest())
        try:
            records, created = await self.plane.jobs.submit(caller.principal, [draft])
        except InvalidSpec as exc:
            if exc.field == "priority":
                raise InvalidSpec("X-Corral-Priority", exc.message) from None
            raise
        return records[0], created

    async def wait(
        self,
        caller: Caller,
        job_id: str,
        on_event: OnEvent | None = None,
        disconnected: Disconnected | None = None,
    ) -> JobRecord:
        """The job once it has ended; ``on_event`` sees each of its events on the way.

        When the client goes away first the job is cancelled (nobody wants its
        answer any more) and ``Conflict`` is raised.
        """
        sessions = self.plane.auth.sessions  # the wait ends if the token is revoked
        follow = self.plane.feed.follow(
            caller.principal, 0, job_id=job_id, disconnected=disconnected
        )
        async for event in one_by_one(sessions.guard(caller.principal.token_id, follow)):
            if event is not None and on_event is not None:
                await on_event(event)
        sessions.check(caller.principal.token_id)  # revoked: 401, and the job is left alone
        rec = await self.plane.jobs.get(caller.principal, job_id)
        if rec.state in JOB.terminal:
            return rec
        await self.plane.jobs.cancel(caller.principal, job_id)
        raise Conflict(f"the client left before job {job_id} ended; the job was cancelled")

    async def files(self, caller: Caller, rec: JobRecord) -> dict[str, bytes]:
        """Every result file of a finished job, by name."""
        out = {}
        for f in rec.result:
            _, data = await self.plane.jobs.result_file(caller.principal, rec.job.id, f.name)
            out[f.name] = data
        return out

    async def preview(self, caller: Caller, job_id: str, url: str) -> bytes:
        """The bytes of a preview named by a ``job.preview`` event's URL."""
        return await self.plane.jobs.preview(caller.principal, job_id, url.rsplit("/", 1)[-1])

    async def interrupt(self, caller: Caller, job_id: str) -> None:
        """Stop early, keep what was made; a job that already ended is left alone."""
        with contextlib.suppress(Conflict):  # it ended meanwhile: nothing to interrupt
            await self.plane.jobs.interrupt(caller.principal, job_id)
