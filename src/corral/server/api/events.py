"""``/v1/events``: every event as SSE, and the whole log as a JSONL trace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from corral.server.api.deps import ERRORS, Caller, Plane
from corral.server.api.jobs import MAX_SEQ, KindFilter, _resume_point, event_stream, kind_set
from corral.server.api.render import event_json
from corral.server.services.auth import Principal
from corral.server.services.feed import EventFeed

router = APIRouter(prefix="/v1/events", tags=["events"], responses=ERRORS)


@router.get(
    "",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}},
)
async def all_events(
    plane: Plane,
    who: Caller,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=20)] = None,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            le=MAX_SEQ,
            description="send the events after this seq first (0: the whole log kept); "
            "default: only events from now on",
        ),
    ] = None,
    kind: KindFilter = None,
) -> StreamingResponse:
    """Every event (a team token: its team's job events), live, from now on. Resumable with
    Last-Event-ID; ``after`` asks for history first.

    ``?kind=job.started&kind=job.succeeded`` keeps only those kinds. A token holds at most
    ``limits.streams_per_token`` streams open (429 past it).
    """
    who.require_client()
    if last_event_id is None and after is None:  # a new follower: what happens next
        start = await plane.feed.head()
    else:
        start = _resume_point(last_event_id, after or 0)
    kinds = kind_set(kind)
    # No ``disconnected`` poll: the streaming response stops the feed when the client leaves.
    return event_stream(plane, who, plane.feed.follow(who, start, kinds=kinds))


@router.get(
    "/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "one event per line"}},
)
async def export(
    plane: Plane,
    who: Caller,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    format: Annotated[
        Literal["events", "sim"],
        Query(description="events: the raw log; sim: one job per line, a corral sim trace"),
    ] = "events",
) -> StreamingResponse:
    """The event log as JSON lines, oldest first (admin).

    ``format=sim`` turns it into a job trace that ``corral sim`` replays: one
    line per job with its resources, team, user, priority, submit time (from 0)
    and the duration it ran.
    """
    who.require_admin("export the event trace")
    if format == "sim":
        rows = (json.dumps(r) + "\n" async for r in plane.feed.sim_trace(who))
        return StreamingResponse(rows, media_type="application/x-ndjson")
    return StreamingResponse(_lines(plane.feed, who, after), media_type="application/x-ndjson")


async def _lines(feed: EventFeed, who: Principal, after: int) -> AsyncIterator[str]:
    async for event, team in feed.export(who, after):
        yield json.dumps(event_json(event, team)) + "\n"
