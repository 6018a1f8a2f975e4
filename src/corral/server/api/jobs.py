"""``/v1/jobs``: submit (one or a batch), read, list, follow, cancel, interrupt, results."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from prometheus_client import Gauge
from pydantic import BaseModel, Field, StringConstraints, TypeAdapter

from corral.core.errors import Conflict, InvalidSpec
from corral.core.events import Event, EventKind
from corral.core.model import JobKind
from corral.core.states import JobState
from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.direct import caller, gathered_by, header, json_body, refuse
from corral.server.api.edits import JobPatchIn
from corral.server.api.render import event_json, job_fields, job_out
from corral.server.api.schemas import (
    BatchIn,
    BatchOut,
    ErrorOut,
    JobIn,
    JobOut,
    JobPage,
    ResultOut,
)
from corral.server.api.served_files import file_headers
from corral.server.api.streams import HeldStream
from corral.server.api.whereabouts import PlacedOut
from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal
from corral.server.services.job_placement import placement
from corral.server.services.jobs import Draft, new_job_id
from corral.server.services.queue_edits import edit
from corral.server.store.job_search import JobFilter
from corral.server.store.jsontext import dumps
from corral.server.store.records import Webhook

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERRORS)

KEY_LENGTH = {"min_length": 1, "max_length": 200}
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="the same key (per team) returns the same job, never a second one",
        **KEY_LENGTH,
    ),
]
_KEY: TypeAdapter[str] = TypeAdapter(Annotated[str, StringConstraints(**KEY_LENGTH)])
MAX_SEQ = 2**63 - 1  # event ids are 64-bit
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KindFilter = Annotated[
    list[EventKind] | None,
    Query(description="only events of these kinds (repeat the parameter); default: all"),
]


def kind_set(kinds: list[EventKind] | None) -> frozenset[str] | None:
    return frozenset(kinds) if kinds else None


def _draft(who: Principal, spec: JobIn, key: str | None) -> Draft:
    team = spec.team or who.team or "default"
    job = spec.to_job(new_job_id(), team=team, idempotency_key=key)
    # Only a submission under an idempotency key is ever compared with another one.
    hook = Webhook(spec.webhook.url, spec.webhook.events) if spec.webhook else None
    digest = spec.request_hash(team) if job.idempotency_key else None
    if not (spec.after or spec.after_any or spec.inputs):
        return Draft(job, digest, spec.labels, hook)
    return Draft(job, digest, spec.labels, hook, tuple(spec.dependencies()), spec.takes())


async def submit(spec: JobIn, plane: Plane, who: Caller, key: IdempotencyKey = None) -> Response:
    """Submit a job. 201 with the job; 200 with the same job when the Idempotency-Key was seen."""
    records, created = await plane.jobs.submit(who, [_draft(who, spec, key)])
    job_id = records[0].job.id
    out = job_fields(
        records[0], plane.schedule.unplaced.get(job_id), eta=plane.schedule.eta.of(job_id)
    )
    # Written here, from the fields: FastAPI would validate a JobOut built from them, then
    # validate it a second time and dump it (the hot path; ``job_fields``).
    return Response(
        dumps(out),
        status_code=201 if created else 200,
        media_type="application/json",
        headers=None if created else {"Idempotent-Replayed": "true"},
    )


async def _submit_args(request: Request) -> dict[str, Any]:
    """``submit``'s arguments, gathered as its declared dependencies would (direct.py)."""
    plane, who = await caller(request)
    errors: list[dict[str, Any]] = []
    key = header(request, "Idempotency-Key", _KEY, errors)
    spec = await json_body(request, JobIn, errors)
    refuse(errors)
    return {"spec": spec, "plane": plane, "who": who, "key": key}


# The hot path: served without per-request dependency solving, documented as declared.
router.add_api_route(
    "",
    submit,
    methods=["POST"],
    status_code=201,
    response_model=JobOut,
    responses={
        200: {"model": JobOut, "description": "a replay of an Idempotency-Key"},
        409: {"model": ErrorOut},
    },
    route_class_override=gathered_by(_submit_args),
)


@router.post(
    "/batch",
    status_code=201,
    response_model=BatchOut,
    responses={200: {"model": BatchOut, "description": "a replay"}, 409: {"model": ErrorOut}},
)
async def submit_batch(
    batch: BatchIn, plane: Plane, who: Caller, response: Response, key: IdempotencyKey = None
) -> BatchOut:
    """Submit many jobs in one request and one transaction: all are created, or none.

    With an Idempotency-Key header, job ``i`` gets the key ``<key>/<i>``.
    """
    limit = plane.rt.settings.api.max_batch_jobs
    if len(batch.jobs) > limit:
        raise InvalidSpec("jobs", f"at most {limit} jobs per batch, got {len(batch.jobs)}")
    drafts = [_draft(who, s, f"{key}/{i}" if key else None) for i, s in enumerate(batch.jobs)]
    records, created = await plane.jobs.submit(who, drafts)
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return BatchOut(jobs=[job_out(r) for r in records])


class ListFilters(BaseModel):
    """The jobs list's filters besides state, team and user."""

    kind: JobKind | None = None
    priority: str | None = Field(None, max_length=64)
    node: str | None = Field(None, max_length=255, description="where it runs or ran")
    model: str | None = Field(None, max_length=255, description="the model it asks for")
    since: float | None = Field(None, ge=0, description="submitted at or after (epoch s)")
    until: float | None = Field(None, ge=0, description="submitted before (epoch s)")
    q: str | None = Field(None, min_length=1, max_length=40, description="ids starting so")
    interrupted: bool | None = Field(None, description="only (or no) interrupted jobs")


@router.get("", response_model=JobPage)
async def list_jobs(
    plane: Plane,
    who: Caller,
    more: Annotated[ListFilters, Query()],
    state: Annotated[list[JobState] | None, Query(description="repeat for several")] = None,
    team: Annotated[str | None, Query(max_length=64)] = None,
    user: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
) -> JobPage:
    """Jobs newest first. Follow ``next_cursor`` for older ones."""
    where = JobFilter(
        kind=more.kind.value if more.kind else None, priority=more.priority, node=more.node,
        model=more.model, since=more.since, until=more.until, id_prefix=more.q,
        interrupted=more.interrupted,
    )  # fmt: skip
    page = await plane.jobs.page(
        who, states=state or (), team=team, user=user, limit=limit, cursor=cursor, where=where
    )
    said = await plane.waits.said()
    return JobPage(
        jobs=[job_out(r, said.unplaced.get(r.job.id), eta=said.eta(r.job.id)) for r in page.jobs],
        next_cursor=page.next_cursor,
    )


@router.get("/{job_id}", response_model=JobOut)
async def get_job(job_id: str, plane: Plane, who: Caller) -> JobOut:
    """One job; a queued one carries the scheduler's reasons in ``queue``; a queued or
    running one its expected start and end in ``eta``; a placed or running one its
    allocations and their GPUs' topology in ``placement``."""
    rec = await plane.jobs.get(who, job_id)
    said = await plane.waits.said()
    out = job_out(rec, said.unplaced.get(job_id), eta=said.eta(job_id))
    placed = await placement(plane.rt, rec)
    out.placement = [PlacedOut(**dataclasses.asdict(p)) for p in placed]
    return out


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}},
)
async def job_events(
    job_id: str,
    plane: Plane,
    who: Caller,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=20)] = None,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="like Last-Event-ID")] = 0,
    kind: KindFilter = None,
) -> StreamingResponse:
    """Server-Sent Events of one job: state changes, progress, previews (as URLs), logs.

    ``?kind=job.progress&kind=job.succeeded`` keeps only those kinds (the
    stream still ends after the job's final event, sent or not).

    Each event has ``id:`` (its sequence number) and ``event:`` (its kind).
    Reconnect with ``Last-Event-ID`` to resume; the stream ends after the
    job's final event.
    """
    start = _resume_point(last_event_id, after)
    await plane.jobs.get(who, job_id)  # 404 now, not inside the stream
    # No ``disconnected`` poll: the streaming response stops the feed when the client leaves.
    return event_stream(
        plane, who, plane.feed.follow(who, start, job_id=job_id, kinds=kind_set(kind))
    )


def _resume_point(last_event_id: str | None, after: int) -> int:
    if last_event_id is None:
        return after
    if not last_event_id.isdigit() or int(last_event_id) > MAX_SEQ:
        raise InvalidSpec("Last-Event-ID", "must be the id of an event from this stream")
    return int(last_event_id)


def event_stream(
    plane: ControlPlane, who: Principal, stream: AsyncIterator[list[Event] | None]
) -> StreamingResponse:
    """``stream`` as an SSE response, held in one of ``who``'s stream places (429 past the
    stream caps) and ended if its token is revoked."""
    slot = plane.streams.admit(who)
    guarded = plane.auth.sessions.guard(who.token_id, stream)
    return HeldStream(sse(guarded, plane.rt.metrics.event_streams), slot, SSE_HEADERS)


async def sse(stream: AsyncIterator[list[Event] | None], open_streams: Gauge) -> AsyncIterator[str]:
    """Frame events as SSE, each list read together in one write; ``None`` from the feed
    becomes a keep-alive comment. ``open_streams`` counts the streams being served: the
    response stops this one (and the feed under it) when its client leaves."""
    open_streams.inc()
    try:
        async for events in stream:
            if events is None:
                yield ": keep-alive\n\n"
                continue
            yield "".join(map(_frame, events))
    finally:
        open_streams.dec()


def _frame(event: Event) -> str:
    body = event_json(event)
    return f"id: {body['seq']}\nevent: {body['kind']}\ndata: {dumps(body)}\n\n"


@router.get("/{job_id}/result", response_model=ResultOut)
async def result(job_id: str, plane: Plane, who: Caller) -> ResultOut:
    """The job's state and its result files (download each from its ``url``)."""
    out = job_out(await plane.jobs.get(who, job_id))
    return ResultOut(id=job_id, state=out.state, error=out.error, files=out.result)


@router.get(
    "/{job_id}/result/{name}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def result_file(job_id: str, name: str, plane: Plane, who: Caller) -> Response:
    """The bytes of one result file (streamed from disk)."""
    f = await plane.jobs.result_ref(who, job_id, name)
    headers = {"ETag": f'"{f.sha256}"', **file_headers(f.name, f.content_type)}
    if f.inline is not None:
        return Response(f.inline, media_type=f.content_type, headers=headers)
    path = plane.rt.blobs.path(f.key)
    if path is not None:
        return FileResponse(path, media_type=f.content_type, headers=headers)
    return Response(await plane.rt.blobs.get(f.key), media_type=f.content_type, headers=headers)


@router.get(
    "/{job_id}/previews/{key}",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
)
async def preview(job_id: str, key: str, plane: Plane, who: Caller) -> Response:
    """A preview image an agent sent while the job ran (URLs come in ``job.preview`` events)."""
    data = await plane.jobs.preview(who, job_id, key)
    media = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp", "gif": "image/gif"}
    content_type = media.get(key.rsplit(".", 1)[-1], "application/octet-stream")
    return Response(data, media_type=content_type, headers=file_headers(key, content_type))


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}},
)
async def delete_job(job_id: str, plane: Plane, who: Caller) -> Response:
    """Delete a finished job now, with its events, results and previews (the retention
    sweep does the same after ``retention.finished_jobs_s``). A queued or running job
    answers 409: cancel it first."""
    await plane.jobs.delete(who, job_id)
    return Response(status_code=204)


@router.patch("/{job_id}", response_model=JobOut, responses={409: {"model": ErrorOut}})
async def edit_job(job_id: str, change: JobPatchIn, plane: Plane, who: Caller) -> JobOut:
    """Change a queued job: priority class, time limit, labels; hold or release it; move it
    to the top of its user's own queue; its user's weight (admin: a new policy version). A
    job no longer queued answers 409."""
    wanted = change.to_edit()
    if change.user_weight is None:
        rec = await edit(plane.rt, who, job_id, wanted, plane.policy.entitle)
        return job_out(rec, plane.schedule.unplaced.get(job_id))
    who.require_admin("change a user's weight")  # before anything changes
    rec = await plane.jobs.get(who, job_id)
    if rec.state is not JobState.QUEUED:
        raise Conflict(f"job {job_id} is {rec.state.value}: only a queued job can be edited")
    if not wanted.empty():
        rec = await edit(plane.rt, who, job_id, wanted, plane.policy.entitle)
    user, weight = rec.job.user, change.user_weight
    note = f"user {user}'s weight set to {weight:g} (PATCH of job {job_id})"
    await plane.policy.set_user_weight(who, user, weight, note)
    return job_out(rec, plane.schedule.unplaced.get(job_id))


@router.post("/{job_id}/cancel", response_model=JobOut, responses={409: {"model": ErrorOut}})
async def cancel(job_id: str, plane: Plane, who: Caller) -> JobOut:
    """Cancel: the job ends now; running work is told to stop. Cancelling twice is harmless."""
    return job_out(await plane.jobs.cancel(who, job_id))


@router.post("/{job_id}/interrupt", response_model=JobOut, responses={409: {"model": ErrorOut}})
async def interrupt(job_id: str, plane: Plane, who: Caller) -> JobOut:
    """Stop early and keep what was produced so far (the agent reports it as the result).

    A job that has not started yet is cancelled.
    """
    return job_out(await plane.jobs.interrupt(who, job_id))
