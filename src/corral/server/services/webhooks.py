"""Webhooks: a job names a URL, and its state changes are posted there, signed.

A delivery is one call to make: an event of a subject (a job, or a pipeline or array
that names its own webhook: called when every job of it has ended, and with ``events:
all`` on each of its jobs' state changes), its JSON body fixed when it is made, retried
with backoff for ``webhooks.retry_for_s``, each attempt recorded (``GET
/v1/{jobs,pipelines,arrays}/{id}/deliveries``). The loop that makes and sends them
(``loops/webhooks.py``) runs beside scheduling and never inside its transactions.

Signing, as Stripe's and GitHub's: each team has one secret; every call carries
``Corral-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``. The
timestamp is inside the signed text, so a receiver that refuses timestamps older than
its replay window (five minutes in the example) refuses a replayed call; the
``Corral-Delivery`` id is the same on every attempt of one delivery, so a receiver
that sees it twice (at-least-once) does the work once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import Forbidden, NotFound
from corral.core.events import TERMINAL_JOB_EVENTS, EventKind
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.unit import Runtime
from corral.server.store import jobs as job_repo
from corral.server.store import webhooks as repo
from corral.server.store.ids import sortable_id
from corral.server.store.jsontext import dumps
from corral.server.store.records import JobRecord

SIGNATURE = "Corral-Signature"
DELIVERY = "Corral-Delivery"
EVENT = "Corral-Event"
HISTORY = 20  # attempts kept per delivery: a day of doubling waits is about that many
SECRET_PREFIX = "whsec_"

END_EVENTS = frozenset(TERMINAL_JOB_EVENTS)
STATE_EVENTS = END_EVENTS | {
    EventKind.JOB_SUBMITTED,
    EventKind.JOB_PLACED,
    EventKind.JOB_STARTED,
    EventKind.JOB_REQUEUED,
    EventKind.JOB_PREEMPTED,
}
"""``events: all`` sends these: every change of the job's state, not its progress."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Corral-Signature`` header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, now: float, window_s: float = 300.0) -> bool:
    """What a receiver checks (the example receiver does the same): a ``v1`` signature of
    ``body`` made with ``secret``, at a time within ``window_s`` of ``now``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > window_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


@dataclass(frozen=True, slots=True)
class Subject:
    """What a delivery reports on: ``kind`` job, pipeline or array, and its id."""

    kind: str
    id: str
    team: str


def enqueue_row(
    subject: Subject, url: str, seq: int, kind: str, body: Mapping[str, Any], now: float,
    *, dropped: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A delivery row to insert (``repo.insert``): the hook point for any subject. ``seq``
    orders a subject's deliveries and makes each unique (an event's sequence number).
    ``dropped``: recorded as failed at once, with this reason (the team's bound)."""
    delivery_id = sortable_id("dlv_")
    text = dumps({"id": delivery_id, "type": kind, **body})
    return {
        "id": delivery_id,
        "subject": subject.id,
        "subject_kind": subject.kind,
        "team": subject.team,
        "event_seq": seq,
        "kind": kind,
        "url": url,
        "body": text,
        "state": "failed" if dropped else repo.PENDING,
        "attempts": 0,
        "next_at": now,
        "created_at": now,
        "delivered_at": None,
        "last_status": None,
        "last_error": dropped,
        "history": [],
        "version": 1,
    }


def job_body(rec: JobRecord | None, event: repo.HookedEvent, max_bytes: int) -> dict[str, Any]:
    """The body of a job's delivery: the event, and the job as it is when the delivery is
    made (its state may be later than the event's). Result lists are cut to fit."""
    out: dict[str, Any] = {
        "created_at": event.at,
        "event": {"seq": event.seq, "kind": event.kind, "at": event.at, "data": event.data},
    }
    if rec is None:
        return out | {"job": {"id": event.job_id}}
    j = rec.job
    files = [
        {"name": f.name, "size": f.size, "content_type": f.content_type, "sha256": f.sha256,
         "url": f"/v1/jobs/{j.id}/result/{f.name}"}
        for f in rec.result
    ]  # fmt: skip
    job = {
        "id": j.id, "state": j.state.value, "team": j.team, "user": j.user,
        "priority": j.priority, "labels": dict(rec.labels), "error": rec.error,
        "progress": rec.progress, "attempt": j.attempt, "node": rec.node,
        "submitted_at": j.submitted_at, "finished_at": rec.finished_at, "result": files,
    }  # fmt: skip
    out["job"] = job
    while files and len(dumps(out)) > max_bytes:
        files.pop()
        job["result_truncated"] = True
    return out


def group_body(
    event: repo.GroupEvent, counts: Mapping[str, int], state: str, job_state: str | None,
    members: Sequence[tuple[str, str]] | None, max_bytes: int,
) -> dict[str, Any]:  # fmt: skip
    """The body of a pipeline's or array's delivery: the job event that made it, the group
    with its state and counts as they are when it is made, and either the changed job
    (``job_state``: a change) or every job's id and state (``members``: its end, the list
    cut to fit ``max_bytes``)."""
    kind = event.group_kind
    out: dict[str, Any] = {
        "created_at": event.at,
        "event": {"seq": event.seq, "kind": event.kind, "at": event.at, "job_id": event.job_id,
                  "data": event.data},
        "group": {"id": event.group_id, "kind": kind, "state": state, "team": event.team,
                  "size": sum(counts.values()), "counts": dict(sorted(counts.items())),
                  "url": f"/v1/{kind}s/{event.group_id}"},
    }  # fmt: skip
    if members is None:
        return out | {"job": {"id": event.job_id, "state": job_state}}
    listed = [{"id": i, "state": s} for i, s in members]
    out["jobs"] = listed
    size = len(dumps(out))
    if size > max_bytes:  # cut in proportion once, then trim: a 100,000-job array stays cheap
        del listed[max(0, len(listed) * max_bytes // size - 1) :]
        out["jobs_truncated"] = True
        while listed and len(dumps(out)) > max_bytes:
            listed.pop()
    return out


async def team_secret(rt: Runtime, conn: AsyncConnection, team: str) -> str:
    """``team``'s signing secret, made on first use."""
    found = await repo.secret(conn, team)
    if found is not None:
        return found
    made = SECRET_PREFIX + secrets.token_urlsafe(32)
    await repo.put_secret(conn, team, made, rt.clock.now())
    return made


class WebhookService:
    """The API's side: a team's secret (shown, rotated) and a job's deliveries."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def secret(self, who: Principal, team: str | None, *, rotate: bool = False) -> str:
        who.require_client()
        name = self._team(who, team)
        async with self.rt.tx() as tx:
            if rotate:
                made = SECRET_PREFIX + secrets.token_urlsafe(32)
                await repo.put_secret(tx.conn, name, made, tx.now)
                await audit.record(tx, who, "webhook.secret.rotate", name, {})
                return made
            return await team_secret(self.rt, tx.conn, name)

    def _team(self, who: Principal, team: str | None) -> str:
        if who.is_admin:
            return team or "default"
        if team is not None and team != who.team:
            raise Forbidden(f"a token of team {who.team!r} cannot read team {team!r}'s secret")
        return who.team or "default"

    async def deliveries(self, who: Principal, job_id: str, limit: int) -> list[Any]:
        """The deliveries of a job visible to ``who``, oldest first."""
        who.require_client()
        async with self.rt.db.read() as conn:
            rec = await job_repo.get(conn, job_id)
            if rec is None or not who.sees(rec.job.team):
                raise NotFound(f"job {job_id} not found")
            return await repo.of_subject(conn, job_id, limit)

    async def group_deliveries(self, who: Principal, group_id: str, limit: int) -> list[Any]:
        """The deliveries of a pipeline's or array's own webhook, oldest first."""
        who.require_client()
        async with self.rt.db.read() as conn:
            team = await repo.group_team(conn, group_id)
            if team is None or not who.sees(team):
                what = "pipeline" if group_id.startswith("pipe_") else "array"
                raise NotFound(f"{what} {group_id} not found")
            return await repo.of_subject(conn, group_id, limit)
