"""The asyncio client: ``AsyncClient`` has the same methods as ``Client``, awaited.

::

    async with AsyncClient(url, token) as corral:
        job = await corral.submit(kind="sample", payload={"prompt": "a red fox"}, gpus=1)
        async for event in job.events():
            print(event.kind, event.progress)
        png = (await job.result()).files[0]

Requests are the same ``calls.Call`` objects the sync client sends, so both
clients speak the API identically.

Over 400 lines on purpose: the mirror of ``client.py`` (with ``admin.py``), method for
method, so the two clients cannot drift apart unseen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from corral import __version__
from corral.sdk import calls, groups, inputs, trust
from corral.sdk.aio_job import AsyncEventStream, AsyncJob
from corral.sdk.calls import UNCHANGED, Unchanged, merge_team
from corral.sdk.client import BATCH_CHUNK, DEFAULT_TIMEOUT
from corral.sdk.config import resolve
from corral.sdk.errors import RETRY_STATUSES, ClientError, ServerUnreachable, api_error
from corral.sdk.events import JobEvent, SseDecoder
from corral.sdk.groups import AsyncGroup
from corral.sdk.inputs import InputFile
from corral.sdk.models import (
    AuditRecord,
    AutoscalerStatus,
    Delivery,
    JobSpec,
    JobStatus,
    NewToken,
    NodeStatus,
    PolicyStatus,
    PolicyVersion,
    QueueStatus,
    ResultStatus,
    TeamQuota,
    UsageReport,
)
from corral.sdk.retry import RETRYABLE, Follow, Retry, describe

T = TypeVar("T")


class AsyncClient:
    """A connection to one corral server for asyncio code. Close it (or ``async with``)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: Retry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        ca_fingerprint: str | None = None,
        ca_cert: str | None = None,
    ) -> None:
        target = resolve(url, token, ca_fingerprint=ca_fingerprint, ca_cert=ca_cert)
        self.url = target.url
        self.url_from = target.url_from
        self.token = target.token
        self.retry = retry or Retry()
        headers = {"User-Agent": f"corral-sdk/{__version__}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=timeout,
            transport=transport or trust.async_transport(target.ca_fingerprint, target.ca_cert),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    # -- jobs ----------------------------------------------------------------------------

    async def submit(
        self,
        spec: JobSpec | Mapping[str, Any] | None = None,
        /,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> AsyncJob:
        """Submit one job (see ``Client.submit``)."""
        files = fields.pop("files", None)
        if files is not None:
            read = await asyncio.to_thread(inputs.read, files)
            refs = [(await self.run(inputs.upload(data, name))).ref(name) for name, data in read]
            fields["inputs"] = [*fields.get("inputs", ()), *refs]
        job_spec = calls.make_spec(spec, fields)
        key = idempotency_key or job_spec.idempotency_key or calls.new_key()
        return AsyncJob(self, await self.run(calls.submit(job_spec, key)))

    async def submit_pipeline(
        self,
        steps: Mapping[str, JobSpec | Mapping[str, Any]],
        *,
        team: str | None = None,
        idempotency_key: str | None = None,
        webhook: Mapping[str, str] | None = None,
    ) -> AsyncGroup:
        """``Client.submit_pipeline``, awaited."""
        return AsyncGroup(
            self,
            await self.run(
                groups.submit_pipeline(steps, team, idempotency_key or calls.new_key(), webhook)
            ),
        )

    async def submit_array(
        self,
        job: JobSpec | Mapping[str, Any],
        count: int,
        *,
        index_key: str = "array_index",
        index_start: int = 0,
        idempotency_key: str | None = None,
        webhook: Mapping[str, str] | None = None,
    ) -> AsyncGroup:
        """``Client.submit_array``, awaited."""
        call = groups.submit_array(
            job, count, index_key, index_start, idempotency_key or calls.new_key(), webhook
        )
        return AsyncGroup(self, await self.run(call))

    async def group(self, group_id: str) -> AsyncGroup:
        """A handle on an existing pipeline (``pipe_...``) or array (``arr_...``)."""
        return AsyncGroup(self, await self.run(groups.get(group_id)))

    async def upload_input(self, source: bytes, name: str) -> InputFile:
        """Upload a file's bytes for jobs to read (see ``Client.upload_input``)."""
        return await self.run(inputs.upload(source, name))

    async def submit_many(
        self,
        specs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        chunk: int = BATCH_CHUNK,
    ) -> list[AsyncJob]:
        """Submit many jobs through the batch endpoint, ``chunk`` per request."""
        checked = [calls.make_spec(s, {}, f"jobs[{i}].") for i, s in enumerate(specs)]
        base = idempotency_key or calls.new_key()
        jobs: list[AsyncJob] = []
        for n, start in enumerate(range(0, len(checked), max(1, chunk))):
            part = checked[start : start + max(1, chunk)]
            key = base if n == 0 and len(checked) <= chunk else f"{base}.{n}"
            jobs += [AsyncJob(self, s) for s in await self.run(calls.submit_batch(part, key))]
        return jobs

    async def job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, await self.run(calls.get_job(job_id)))

    async def jobs(
        self,
        *,
        state: str | Sequence[str] | None = None,
        team: str | None = None,
        user: str | None = None,
        limit: int = 50,
    ) -> list[JobStatus]:
        """Jobs newest first, filtered; follows pages until ``limit`` jobs are read."""
        states = [state] if isinstance(state, str) else list(state or ())
        out: list[JobStatus] = []
        cursor: str | None = None
        while len(out) < limit:
            call = calls.list_jobs(
                states=states, team=team, user=user, limit=limit - len(out), cursor=cursor
            )
            page = await self.run(call)
            out += page.jobs
            cursor = page.next_cursor
            if not cursor or not page.jobs:
                break
        return out

    async def queue(self, limit: int = 100) -> QueueStatus:
        return await self.run(calls.queue(limit))

    # -- nodes, teams, tokens ------------------------------------------------------------

    async def autoscaler(self) -> AutoscalerStatus:
        """The autoscaler's pools, its machines and its last decision (admin)."""
        return await self.run(calls.autoscaler())

    async def nodes(self) -> list[NodeStatus]:
        return await self.run(calls.list_nodes())

    async def node(self, name: str) -> NodeStatus:
        return await self.run(calls.get_node(name))

    async def pause_node(self, name: str) -> NodeStatus:
        return await self.run(calls.node_action(name, "pause"))

    async def resume_node(self, name: str) -> NodeStatus:
        return await self.run(calls.node_action(name, "resume"))

    async def drain_node(self, name: str) -> NodeStatus:
        return await self.run(calls.node_action(name, "drain"))

    async def delete_node(self, name: str) -> None:
        """``Client.delete_node``."""
        await self.run(calls.delete_node(name))

    async def policy(self) -> PolicyStatus:
        """``Client.policy``."""
        return await self.run(calls.get_policy())

    async def apply_policy(self, document: str, note: str = "") -> PolicyStatus:
        """``Client.apply_policy``."""
        return await self.run(calls.put_policy(document, note))

    async def check_policy(self, document: str) -> dict[str, Any]:
        """``Client.check_policy``."""
        return await self.run(calls.check_policy(document))

    async def policy_history(self, limit: int = 50) -> list[PolicyVersion]:
        """``Client.policy_history``."""
        return await self.run(calls.policy_history(limit))

    async def rollback_policy(self, version: int) -> PolicyStatus:
        """``Client.rollback_policy``."""
        return await self.run(calls.rollback_policy(version))

    async def usage(
        self, by: Sequence[str] = ("team",), since: float | None = None, until: float | None = None
    ) -> UsageReport:
        """``Client.usage``."""
        return await self.run(calls.usage(by, since, until))

    async def teams(self) -> list[TeamQuota]:
        return await self.run(calls.list_teams())

    async def set_team(
        self,
        name: str,
        *,
        quota: float | None = None,
        borrow_limit: float | Unchanged | None = UNCHANGED,
        weight: float | None = None,
    ) -> TeamQuota:
        """Create or change a team (admin); settings not given keep their value."""
        current = next((t for t in await self.teams() if t.name == name), None)
        return await self.run(
            calls.put_team(merge_team(name, current, quota, borrow_limit, weight))
        )

    async def create_token(self, kind: str, name: str, team: str | None = None) -> NewToken:
        return await self.run(calls.create_token(kind, name, team))

    async def audit(
        self,
        *,
        actor: str | None = None,
        team: str | None = None,
        action: str | Sequence[str] | None = None,
        target: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> list[AuditRecord]:
        """The audit log, newest first (admin): who made, changed or removed what, when and
        from where. ``actor`` is a token's id or name, ``action`` one or several actions
        (``job.*``: every job action), ``since``/``until`` epoch seconds. Follows pages
        until ``limit`` records are read."""
        actions = [action] if isinstance(action, str) else list(action or ())
        out: list[AuditRecord] = []
        cursor: str | None = None
        while len(out) < limit:
            call = calls.audit(
                actor=actor, team=team, actions=actions, target=target, since=since,
                until=until, limit=limit - len(out), cursor=cursor,
            )  # fmt: skip
            page = await self.run(call)
            out += page.records
            cursor = page.next_cursor
            if not cursor or not page.records:
                break
        return out

    async def health(self) -> dict[str, Any]:
        return await self.run(calls.health())

    # -- plumbing used by AsyncJob -------------------------------------------------------

    async def result_status(self, job_id: str) -> ResultStatus:
        return await self.run(calls.result(job_id))

    async def stop_job(self, job_id: str, how: str) -> JobStatus:
        return await self.run(calls.stop(job_id, how))

    async def edit_job(
        self,
        job_id: str,
        *,
        priority: str | None = None,
        timeout_s: float | None = None,
        labels: Mapping[str, str] | None = None,
        hold: bool | None = None,
        top: bool = False,
        user_weight: float | None = None,
    ) -> JobStatus:
        """``Client.edit_job``."""
        change = calls.edits(priority, timeout_s, labels, hold, top, user_weight)
        return await self.run(calls.edit_job(job_id, change))

    async def deliveries(self, job_id: str, limit: int = 100) -> list[Delivery]:
        """``Client.deliveries``."""
        return await self.run(calls.deliveries(job_id, limit))

    async def webhook_secret(self, team: str | None = None, *, rotate: bool = False) -> str:
        """``Client.webhook_secret``."""
        return await self.run(calls.webhook_secret(team, rotate))

    async def delete_job(self, job_id: str) -> None:
        """``Client.delete_job``."""
        await self.run(calls.delete_job(job_id))

    async def download(self, path: str) -> bytes:
        return (await self.request("GET", path)).content

    def events(
        self,
        job_id: str,
        *,
        after: int = 0,
        idle_timeout: float | None = None,
        kinds: Iterable[str] = (),
    ) -> AsyncEventStream:
        follow = Follow(
            job_id, self.url, self.retry, last=after, idle_timeout=idle_timeout, kinds=tuple(kinds)
        )
        return AsyncEventStream(self.stream_events(follow), follow)

    async def run(self, call: calls.Call[T]) -> T:
        response = await self.request(
            call.method,
            call.path,
            params=call.params,
            headers=call.headers,
            **({"json": call.json} if call.content is None else {"content": call.content}),
        )
        return call.parse(response.json() if response.content else None)

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request, retried on connection errors and 502/503/504; errors raise."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(method, path, **kw)
            except httpx.UnsupportedProtocol as exc:
                raise ClientError(f"bad server URL {self.url!r}: {exc}") from None
            except RETRYABLE as exc:
                delay = self.retry.delay(attempt)
                if delay is None:
                    raise self._unreachable(exc, attempt) from exc
                await asyncio.sleep(delay)
                continue
            if response.status_code in RETRY_STATUSES:
                delay = self.retry.delay(attempt)
                if delay is not None:
                    await asyncio.sleep(delay)
                    continue
            if response.status_code >= 400:
                raise api_error(response)
            return response

    def _unreachable(self, exc: BaseException, attempts: int) -> ServerUnreachable:
        where = "" if self.url_from in ("--url", "default") else f" (from {self.url_from})"
        return ServerUnreachable(self.url + where, describe(exc), attempts=attempts)

    async def stream_events(self, follow: Follow) -> AsyncGenerator[JobEvent, None]:
        """Events of one job across reconnections, until its final event."""
        while True:
            try:
                async for event in self._stream_once(follow):
                    follow.seen(event.seq, time.monotonic())
                    yield event
                    if event.terminal:
                        return
            except RETRYABLE as exc:
                delay = follow.broken(exc, time.monotonic())
                if delay is None:
                    return
                await asyncio.sleep(delay)
                continue
            if (await self.run(calls.get_job(follow.job_id))).done:
                return
            await asyncio.sleep(follow.ended_early())

    async def _stream_once(self, follow: Follow) -> AsyncIterator[JobEvent]:
        timeout = httpx.Timeout(10.0, read=follow.read_timeout(time.monotonic()))
        path = calls.events_path(follow.job_id)
        async with self._http.stream(
            "GET", path, params=follow.params(), headers=follow.headers(), timeout=timeout
        ) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                raise api_error(resp)
            decoder = SseDecoder()
            async for line in resp.aiter_lines():
                event = decoder.feed(line)
                if event is not None and event.seq > follow.last:
                    yield event
