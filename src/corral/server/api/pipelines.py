"""``/v1/pipelines`` and ``/v1/arrays``: jobs submitted, followed, cancelled as one.

A pipeline is a small DAG of steps named within the request (``steps``: name ->
job, with ``after``, ``after_any`` and ``inputs: [{from: step, file, as}]``
naming other steps); an array is ``count`` copies of one job, element ``i``
carrying its index in its payload (``index_key``) and, for a command, in
``CORRAL_ARRAY_INDEX``. Both are refused whole with a 422 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from corral.core.errors import InvalidSpec
from corral.core.states import JobState
from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.jobs import IdempotencyKey
from corral.server.api.render import job_out
from corral.server.api.schemas import ApiModel, JobIn, JobOut, Label, Name, WebhookIn
from corral.server.services.jobs import Draft, new_job_id
from corral.server.services.pipelines import (
    MAX_STEPS,
    GroupView,
    StepRefs,
    new_group_id,
    order_steps,
)
from corral.server.store.records import Webhook

router = APIRouter(tags=["pipelines"], responses=ERRORS)

GROUP_HOOK = "called when every job of it has ended (events all: also on each job's change)"
StepName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.-]*$")]


class StepIn(JobIn):
    """One step: a job whose ``after``, ``after_any`` and ``inputs[].from`` name other
    steps (or existing job ids)."""

    outputs: list[Label] | None = Field(
        None,
        max_length=256,
        description="the files it makes, when known: a step reading another file of it "
        "is refused at submission",
    )


class PipelineIn(ApiModel):
    steps: dict[StepName, StepIn] = Field(min_length=1, max_length=MAX_STEPS)
    team: Name | None = Field(None, description="default: the token's team, or 'default'")
    webhook: WebhookIn | None = Field(None, description=GROUP_HOOK)


class ArrayIn(ApiModel):
    job: JobIn
    count: int = Field(ge=1, le=100_000, description="elements (at most api.max_batch_jobs)")
    index_key: Label = Field(
        "array_index", description="the payload field that gets each element's index"
    )
    index_start: int = Field(0, ge=0, le=2**31, description="the first element's index")
    webhook: WebhookIn | None = Field(None, description=GROUP_HOOK)


class PriorityIn(ApiModel):
    priority: Name


class StepOut(BaseModel):
    name: str
    job_id: str
    state: str
    after: list[str] = Field(description="the steps it runs after: the graph's edges")
    progress: float
    error: str | None


class GroupOut(BaseModel):
    id: str
    kind: str
    state: str = Field(
        description="running until every job ended; then failed, cancelled or succeeded"
    )
    team: str
    user: str
    size: int
    created_at: float
    progress: float = Field(description="0..1: ended jobs whole, the others by their progress")
    counts: dict[str, int] = Field(description="jobs by state")
    steps: list[StepOut] | None = Field(None, description="a pipeline's steps, in run order")
    webhook: dict[str, str] | None = Field(None, description="its own: url and events")
    jobs: list[JobOut]


class GroupPage(BaseModel):
    items: list[GroupOut]


def group_out(view: GroupView) -> GroupOut:
    counts: dict[str, int] = {}
    for r in view.jobs:
        counts[r.state.value] = counts.get(r.state.value, 0) + 1
    steps = None
    if view.group.kind == "pipeline":
        names = {r.job.id: r.member or r.job.id for r in view.jobs}
        steps = [
            StepOut(
                name=r.member or r.job.id,
                job_id=r.job.id,
                state=r.state.value,
                after=[names.get(dep, dep) for dep, _ in r.after],
                progress=1.0 if r.state is JobState.SUCCEEDED else r.progress,
                error=r.error,
            )
            for r in view.jobs
        ]
    g = view.group
    return GroupOut(
        id=g.id,
        kind=g.kind,
        state=view.state,
        team=g.team,
        user=g.user,
        size=g.size,
        created_at=view.created_at,
        progress=view.progress,
        counts=counts,
        steps=steps,
        webhook={"url": g.webhook.url, "events": g.webhook.events} if g.webhook else None,
        jobs=[job_out(r) for r in view.jobs],
    )


@router.post(
    "/v1/pipelines",
    status_code=201,
    response_model=GroupOut,
    responses={200: {"model": GroupOut, "description": "a replay of an Idempotency-Key"}},
)
async def submit_pipeline(
    spec: PipelineIn, plane: Plane, who: Caller, response: Response, key: IdempotencyKey = None
) -> GroupOut:
    """Submit a pipeline: accepted whole (201) or refused whole (422 naming step and field).
    With an Idempotency-Key, step ``name`` gets the key ``<key>/<name>``: the same request
    again returns the same pipeline (200)."""
    team = spec.team or who.team or "default"
    user = next(iter(spec.steps.values())).user
    order = order_steps({name: _refs(step) for name, step in spec.steps.items()})
    group_id = new_group_id("pipeline")
    ids = {name: new_job_id() for name in spec.steps}
    drafts = []
    for name in order:
        step = spec.steps[name]
        if step.team is not None and step.team != team:
            raise InvalidSpec(f"steps.{name}.team", f"every step is the pipeline's team {team!r}")
        after = tuple(
            (ids.get(ref, ref), need, f"steps.{name}.{field}")
            for ref, need, field in step.dependencies()
        )
        job_key = f"{key}/{name}" if key else None
        job = step.to_job(ids[name], team=team, idempotency_key=job_key)
        digest = step.request_hash(team) if job_key else None
        drafts.append(
            Draft(job, digest, step.labels, _hook(step), after, step.takes(ids), group_id, name)
        )
    hook = _hook(spec)
    view, created = await plane.pipelines.submit(who, "pipeline", drafts, team, user, hook)
    return _answer(view, created, response)


def _answer(view: GroupView, created: bool, response: Response) -> GroupOut:
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return group_out(view)


def _refs(step: StepIn) -> StepRefs:
    after = [(ref, field) for ref, _, field in step.dependencies()]
    reads = [
        (f.from_, f.file, f"inputs[{i}].file")
        for i, f in enumerate(step.inputs)
        if f.from_ is not None
    ]
    return StepRefs(after, reads, step.outputs)


@router.post(
    "/v1/arrays",
    status_code=201,
    response_model=GroupOut,
    responses={200: {"model": GroupOut, "description": "a replay of an Idempotency-Key"}},
)
async def submit_array(
    spec: ArrayIn, plane: Plane, who: Caller, response: Response, key: IdempotencyKey = None
) -> GroupOut:
    """Submit ``count`` copies of a job as one array, each with its index. With an
    Idempotency-Key, element ``i`` gets the key ``<key>/<i>`` (a replay answers 200)."""
    limit = plane.rt.settings.api.max_batch_jobs
    if spec.count > limit:
        raise InvalidSpec("count", f"at most {limit} elements (api.max_batch_jobs)")
    team = spec.job.team or who.team or "default"
    group_id = new_group_id("array")
    drafts = [_element(spec, i, team, group_id, key) for i in range(spec.count)]
    hook = _hook(spec)
    view, created = await plane.pipelines.submit(who, "array", drafts, team, spec.job.user, hook)
    return _answer(view, created, response)


def _element(spec: ArrayIn, i: int, team: str, group_id: str, key: str | None) -> Draft:
    """Element ``i``: the job with its index in the payload (and a command's environment)."""
    index = spec.index_start + i
    payload: dict[str, Any] = {**spec.job.payload, spec.index_key: index}
    if spec.job.backend == "command":
        env = payload.get("env")
        payload["env"] = {
            **(env if isinstance(env, dict) else {}),
            "CORRAL_ARRAY_INDEX": str(index),
        }
    job_in = spec.job.model_copy(update={"payload": payload})
    job_key = f"{key}/{i}" if key else None
    job = job_in.to_job(new_job_id(), team=team, idempotency_key=job_key)
    digest = job_in.request_hash(team) if job_key else None
    after = tuple((ref, need, f"job.{field}") for ref, need, field in job_in.dependencies())
    return Draft(job, digest, job_in.labels, _hook(job_in), after, job_in.takes(), group_id, str(i))


def _hook(spec: JobIn | PipelineIn | ArrayIn) -> Webhook | None:
    return Webhook(spec.webhook.url, spec.webhook.events) if spec.webhook else None


def _lister(kind: str) -> Any:
    async def listing(
        plane: Plane, who: Caller, limit: Annotated[int, Query(ge=1, le=100)] = 20
    ) -> GroupPage:
        return GroupPage(items=[group_out(v) for v in await plane.pipelines.page(who, kind, limit)])

    listing.__doc__ = f"The newest {kind}s the caller sees, with their jobs."
    return listing


for _kind in ("pipeline", "array"):
    router.add_api_route(f"/v1/{_kind}s", _lister(_kind), methods=["GET"], response_model=GroupPage)


@router.get("/v1/pipelines/{group_id}", response_model=GroupOut)
@router.get("/v1/arrays/{group_id}", response_model=GroupOut)
async def get_group(group_id: str, plane: Plane, who: Caller) -> GroupOut:
    """A pipeline (its steps as a graph) or array, with its jobs and aggregate progress."""
    return group_out(await plane.pipelines.get(who, group_id))


@router.post("/v1/pipelines/{group_id}/cancel", response_model=GroupOut)
@router.post("/v1/arrays/{group_id}/cancel", response_model=GroupOut)
async def cancel_group(group_id: str, plane: Plane, who: Caller) -> GroupOut:
    """Cancel every job of it that has not ended."""
    return group_out(await plane.pipelines.cancel(who, group_id))


@router.patch("/v1/pipelines/{group_id}", response_model=GroupOut)
@router.patch("/v1/arrays/{group_id}", response_model=GroupOut)
async def reprioritise_group(
    group_id: str, change: PriorityIn, plane: Plane, who: Caller
) -> GroupOut:
    """Move its jobs not yet placed to another priority class."""
    view = await plane.pipelines.reprioritise(who, group_id, change.priority)
    return group_out(view)
