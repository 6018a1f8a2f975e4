"""The webhook loop: job events -> deliveries -> signed calls (``services/webhooks.py``).

Each pass, on the scheduling leader only:

1. **Follow.** The events after the cursor whose job names a webhook become
   deliveries, and so do those whose job's pipeline or array names one (its end,
   and with ``events: all`` its jobs' changes), in one transaction with the
   cursor's move (compare and set: a second writer makes none twice). Migration
   0020 starts the cursor at the newest event then (no job named a webhook before).
2. **Send.** Due deliveries are leased (their ``next_at`` moved past the call's
   timeout, guarded by version) and called in background tasks: at most
   ``webhooks.concurrency`` at once, ``per_team_concurrency`` for one team, so a
   slow receiver delays only its own team's calls, and nothing here waits on a
   receiver while it follows events or while scheduling runs.

A call connects to the address the host resolved to and was checked against
(``webhook_urls.refusal``), never follows redirects, reads at most ``ANSWER``
bytes of the answer and gives up after ``webhooks.timeout_s``. A 2xx delivers;
410 Gone and a refused address fail at once; anything else is retried after
``first_retry_s``, doubling up to ``max_retry_s``, until ``retry_for_s`` has
passed since the delivery was made.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from corral.core.states import JobState
from corral.server.services.pipelines import group_state
from corral.server.services.unit import Runtime
from corral.server.services.webhooks import (
    DELIVERY,
    END_EVENTS,
    EVENT,
    HISTORY,
    SIGNATURE,
    STATE_EVENTS,
    Subject,
    enqueue_row,
    group_body,
    job_body,
    sign,
    team_secret,
)
from corral.server.store import jobs as job_repo
from corral.server.store import webhooks as repo
from corral.server.webhook_urls import refusal

log = logging.getLogger("corral.server.webhooks")

SPAN = 5000  # events looked at per pass: a backlog is caught up in steps, each one short
ANSWER = 1024  # bytes of a receiver's answer read (kept in the error of a failed attempt)
LEASE_MARGIN_S = 30.0  # a leased call's row is due again this long after its timeout
USER_AGENT = "corral-webhooks/1"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call's end: the receiver's status (None: no answer), and why it failed."""

    status: int | None
    error: str | None
    final: bool = False  # do not retry (410 Gone, a refused address)

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class WebhookLoop:
    def __init__(self, rt: Runtime, leading: Callable[[], bool] | None = None) -> None:
        self.rt = rt
        self.settings = rt.settings.webhooks
        self.leading = leading or (lambda: True)
        self._calls: set[asyncio.Task[None]] = set()
        self._by_team: Counter[str] = Counter()
        self._client: httpx.AsyncClient | None = None

    async def run(self) -> None:
        while True:
            await self.rt.clock.sleep(self.settings.poll_s)
            if not self.leading() or not self.settings.enabled:
                continue
            try:
                await self.tick()
            except Exception:  # a bad pass must not stop the loop: the next one retries
                log.exception("webhook pass failed")

    async def tick(self) -> None:
        """One pass: follow the events, then start the calls that are due."""
        while await self.follow():
            pass
        await self.send_due()

    async def close(self) -> None:
        for task in list(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def wait_idle(self) -> None:
        """Until the calls in flight have ended (tests, a clean stop)."""
        while self._calls:
            await asyncio.gather(*list(self._calls), return_exceptions=True)

    async def follow(self) -> bool:
        """Turn up to ``SPAN`` events into deliveries; True when more may be waiting."""
        async with self.rt.db.write(ordered_events=False) as conn:
            at = await repo.cursor(conn)
            head = await repo.last_event(conn)
            if at is None:  # migration 0020 starts it; a store emptied by hand starts over
                await repo.start_cursor(conn, 0)
                at = 0
            first = await repo.next_event(conn, at) if head > at else None
            if first is None:
                return False
            upto = min(head, first - 1 + SPAN)
            hooked = await repo.hooked_events(conn, at, upto, STATE_EVENTS)
            wanted = [e for e in hooked if e.events == "all" or e.kind in END_EVENTS]
            grouped = await repo.group_events(conn, at, upto, STATE_EVENTS)
            teams = {e.team for e in hooked} | {e.team for e in grouped}
            pending = Counter(await repo.pending_by_team(conn, teams)) if teams else Counter()
            rows = await self._rows(conn, wanted, pending)
            rows += await self._group_rows(conn, grouped, pending)
            if not await repo.move_cursor(conn, at, upto):
                raise RuntimeError("another writer moved the webhook cursor; rolled back")
            await repo.insert(conn, rows)
        return upto < head

    async def _rows(
        self, conn: Any, hooked: list[repo.HookedEvent], pending: Counter[str]
    ) -> list[dict[str, Any]]:
        if not hooked:
            return []
        records = await job_repo.get_many(conn, {e.job_id for e in hooked})
        rows = []
        for e in hooked:
            body = job_body(records.get(e.job_id), e, self.settings.max_body_bytes)
            subject = Subject("job", e.job_id, e.team)
            rows.append(self._row(subject, e.url, e.seq, e.kind, body, pending))
        return rows

    async def _group_rows(
        self, conn: Any, hooked: list[repo.GroupEvent], pending: Counter[str]
    ) -> list[dict[str, Any]]:
        """A group's deliveries: its end, once, at the last of its jobs' end events (the
        one after which none is left running), named ``<kind>.<state>`` and carrying that
        event; with ``events: all`` also each other state change of its jobs."""
        by_group: dict[str, list[repo.GroupEvent]] = {}
        for e in hooked:
            by_group.setdefault(e.group_id, []).append(e)
        rows = []
        cut = self.settings.max_body_bytes
        for group_id, evs in by_group.items():
            counts = await repo.group_counts(conn, group_id)
            state = group_state(JobState(s) for s in counts)
            end = None
            if state != "running" and any(e.kind in END_EVENTS for e in evs):
                last = await repo.last_group_event(conn, group_id, END_EVENTS)
                end = next((e for e in evs if e.seq == last), None)
            changes = [e for e in evs if e is not end and e.events == "all"]
            states = await repo.job_states(conn, {e.job_id for e in changes}) if changes else {}
            for e in changes:
                body = group_body(e, counts, state, states.get(e.job_id), None, cut)
                subject = Subject(e.group_kind, group_id, e.team)
                rows.append(self._row(subject, e.url, e.seq, e.kind, body, pending))
            if end is not None:  # listed once, at the end: an array may hold 100,000 jobs
                members = await repo.group_jobs(conn, group_id)
                body = group_body(end, counts, state, None, members, cut)
                subject = Subject(end.group_kind, group_id, end.team)
                kind = f"{end.group_kind}.{state}"
                rows.append(self._row(subject, end.url, end.seq, kind, body, pending))
        return rows

    def _row(
        self, subject: Subject, url: str, seq: int, kind: str, body: dict[str, Any],
        pending: Counter[str],
    ) -> dict[str, Any]:  # fmt: skip
        """A delivery row; recorded as failed at once when its team has
        ``max_pending_per_team`` waiting (a receiver down must not grow the table unbounded)."""
        cap, dropped = self.settings.max_pending_per_team, None
        if pending[subject.team] >= cap:
            dropped = f"not sent: team {subject.team} has {cap} deliveries waiting "
            dropped += "(webhooks.max_pending_per_team)"
        else:
            pending[subject.team] += 1
        now = self.rt.clock.now()
        return enqueue_row(subject, url, seq, kind, body, now, dropped=dropped)

    async def send_due(self) -> int:
        """Lease the due calls there is room for, then start them (after the lease's
        commit: no call runs inside a transaction); how many started."""
        room = self.settings.concurrency - len(self._calls)
        if room <= 0:
            return 0
        now = self.rt.clock.now()
        lease = now + self.settings.timeout_s + LEASE_MARGIN_S
        busy = Counter(self._by_team)
        leased: list[tuple[Any, str]] = []
        async with self.rt.db.write(ordered_events=False, durable=False) as conn:
            for row in await repo.due(conn, now, room * 4):
                if len(leased) >= room or busy[row.team] >= self.settings.per_team_concurrency:
                    continue
                if await repo.update(conn, row.id, row.version, next_at=lease):
                    busy[row.team] += 1
                    leased.append((row, await team_secret(self.rt, conn, row.team)))
        for row, secret in leased:
            self._start(row, row.version + 1, secret)
        return len(leased)

    def _start(self, row: Any, version: int, secret: str) -> None:
        self._by_team[row.team] += 1
        task = asyncio.create_task(self._deliver(row, version, secret), name="corral-webhook")
        self._calls.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._calls.discard(t)
            self._by_team[row.team] -= 1

        task.add_done_callback(done)

    async def _deliver(self, row: Any, version: int, secret: str) -> None:
        began = time.monotonic()
        outcome = await self.call(row.url, row.body.encode(), row.id, row.kind, secret)
        took_ms = round((time.monotonic() - began) * 1000, 1)
        try:
            await self._record(row, version, outcome, took_ms)
        except Exception:  # its lease ends and it is sent again: at least once
            log.exception("could not record webhook delivery %s", row.id)

    async def call(self, url: str, body: bytes, delivery: str, kind: str, secret: str) -> Outcome:
        """One signed POST of ``body`` to ``url``, to the address checked."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as e:
            return Outcome(None, f"cannot resolve {host}: {e}")
        addresses = [str(info[4][0]) for info in infos]
        refused = refusal(addresses, self.settings.allow_private)
        if refused is not None:
            return Outcome(None, refused, final=True)
        address = addresses[0]
        shown = f"[{address}]" if ":" in address else address
        target = urlunsplit(parts._replace(netloc=f"{shown}:{port}"))
        headers = {
            "Host": parts.netloc,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            DELIVERY: delivery,
            EVENT: kind,
            SIGNATURE: sign(secret, int(self.rt.clock.now()), body),
        }
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        try:
            return await asyncio.wait_for(
                self._post(target, body, headers, extensions), self.settings.timeout_s
            )
        except TimeoutError:
            return Outcome(None, f"no answer within {self.settings.timeout_s:g}s")
        except httpx.HTTPError as e:
            return Outcome(None, f"{type(e).__name__}: {e}"[:500])

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], extensions: dict[str, Any]
    ) -> Outcome:
        client = self._http()
        request = client.build_request("POST", url, content=body, headers=headers)
        request.extensions.update(extensions)
        response = await client.send(request, stream=True)
        try:
            answer = b""
            async for chunk in response.aiter_raw():
                answer += chunk
                if len(answer) >= ANSWER:
                    break
        finally:
            await response.aclose()
        status = response.status_code
        if 200 <= status < 300:
            return Outcome(status, None)
        text = answer[:200].decode("utf-8", "replace").strip()
        return Outcome(
            status, f"HTTP {status}" + (f": {text}" if text else ""), final=status == 410
        )

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                follow_redirects=False,
                trust_env=False,  # no proxy from the environment: calls go where checked
                timeout=self.settings.timeout_s,
                limits=httpx.Limits(max_connections=self.settings.concurrency),
            )
        return self._client

    async def _record(self, row: Any, version: int, outcome: Outcome, took_ms: float) -> None:
        now = self.rt.clock.now()
        attempts = row.attempts + 1
        entry = {"at": now, "status": outcome.status, "error": outcome.error, "ms": took_ms}
        history = [*(row.history or []), entry][-HISTORY:]
        values: dict[str, Any] = {
            "attempts": attempts,
            "last_status": outcome.status,
            "last_error": outcome.error,
            "history": history,
        }
        if outcome.delivered:
            values |= {"state": "delivered", "delivered_at": now}
        else:
            wait = min(self.settings.first_retry_s * 2 ** (attempts - 1), self.settings.max_retry_s)
            if outcome.final or now + wait > row.created_at + self.settings.retry_for_s:
                values["state"] = "failed"
            else:
                values["next_at"] = now + wait
        async with self.rt.db.write(ordered_events=False) as conn:
            await repo.update(conn, row.id, version, **values)
