"""The synchronous client: ``Client(url, token)`` and everything a person or a web app does.

::

    from corral.sdk import Client

    with Client("http://127.0.0.1:8470", token="corral_...") as corral:
        job = corral.submit(kind="sample", payload={"prompt": "a red fox"}, gpus=1)
        for event in job.events():
            print(event.kind, event.progress)
        job.result().save("out/")

Connection failures are retried with backoff (``Retry``); every submission
carries an Idempotency-Key, so a retry can never create a second job.

Over 400 lines on purpose: this is the SDK's one synchronous surface, a method per call a
user makes (jobs, inputs, nodes, models, tokens), mirrored method for method by ``aio.py``.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from corral import __version__
from corral.sdk import calls, groups, inputs, registry, trust
from corral.sdk.admin import AdminCalls
from corral.sdk.config import resolve
from corral.sdk.errors import RETRY_STATUSES, ClientError, ServerUnreachable, api_error
from corral.sdk.events import JobEvent, SseDecoder
from corral.sdk.groups import Group
from corral.sdk.inputs import InputFile
from corral.sdk.job import EventStream, Job
from corral.sdk.models import (
    AutoscalerStatus,
    Delivery,
    JobSpec,
    JobStatus,
    NodeStatus,
    QueueStatus,
    ResultStatus,
)
from corral.sdk.registry import ModelInfo, Progress, add_local_file
from corral.sdk.retry import RETRYABLE, Follow, Retry, describe

T = TypeVar("T")
DEFAULT_TIMEOUT = 30.0
BATCH_CHUNK = 500  # jobs per batch request; the server accepts up to api.max_batch_jobs


class Client(AdminCalls):
    """A connection (pool) to one corral server; close it (or use ``with``) when done.

    ``url`` and ``token`` default to ``CORRAL_URL`` / ``CORRAL_TOKEN``, then
    ``~/.corral/config.toml``, then ``http://127.0.0.1:8470``. For an https
    server with a self-signed certificate, pin it with ``ca_fingerprint`` (or
    ``CORRAL_CA_FINGERPRINT``), or trust its CA with ``ca_cert`` (``CORRAL_CA_CERT``).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
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
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout,
            transport=transport or trust.sync_transport(target.ca_fingerprint, target.ca_cert),
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- jobs ----------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec | Mapping[str, Any] | None = None,
        /,
        *,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Job:
        """Submit one job: a ``JobSpec``, a mapping, or keyword fields (or a mix).

        ``gpus=``, ``vram=``, ``cpus=``, ``memory=``, ``gpu_models=`` are shortcuts for
        ``resources={...}``. Pass ``idempotency_key`` to make a submission
        safe to repeat across processes; one is generated otherwise. ``files=`` (paths, or
        ``{name: path or bytes}``) uploads each as an input file and adds it to ``inputs``.
        """
        files = fields.pop("files", None)
        if files is not None:
            refs = [self.upload_input(data, name).ref(name) for name, data in inputs.read(files)]
            fields["inputs"] = [*fields.get("inputs", ()), *refs]
        job_spec = calls.make_spec(spec, fields)
        key = idempotency_key or job_spec.idempotency_key or calls.new_key()
        return Job(self, self.run(calls.submit(job_spec, key)))

    def submit_many(
        self,
        specs: Iterable[JobSpec | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        chunk: int = BATCH_CHUNK,
    ) -> list[Job]:
        """Submit many jobs through the batch endpoint, ``chunk`` per request (each all or none)."""
        checked = [calls.make_spec(s, {}, f"jobs[{i}].") for i, s in enumerate(specs)]
        base = idempotency_key or calls.new_key()
        jobs: list[Job] = []
        for n, start in enumerate(range(0, len(checked), max(1, chunk))):
            part = checked[start : start + max(1, chunk)]
            key = base if n == 0 and len(checked) <= chunk else f"{base}.{n}"
            jobs += [Job(self, s) for s in self.run(calls.submit_batch(part, key))]
        return jobs

    def submit_pipeline(
        self,
        steps: Mapping[str, JobSpec | Mapping[str, Any]],
        *,
        team: str | None = None,
        idempotency_key: str | None = None,
        webhook: Mapping[str, str] | None = None,
    ) -> Group:
        """Submit a pipeline: ``steps`` maps a name to a job whose ``after``, ``after_any``
        and ``inputs`` (``{"from": step, "file": ..., "as": ...}``) name other steps; a step
        may say its ``outputs``. Accepted or refused whole (``BadRequest`` naming
        ``steps.<name>.<field>``). ``webhook``: ``{"url": ..., "events": "end"|"all"}``,
        the pipeline's own, called when every step has ended."""
        return Group(
            self,
            self.run(
                groups.submit_pipeline(steps, team, idempotency_key or calls.new_key(), webhook)
            ),
        )

    def submit_array(
        self,
        job: JobSpec | Mapping[str, Any],
        count: int,
        *,
        index_key: str = "array_index",
        index_start: int = 0,
        idempotency_key: str | None = None,
        webhook: Mapping[str, str] | None = None,
    ) -> Group:
        """Submit ``count`` copies of ``job`` as one array; element ``i`` gets
        ``index_start + i`` in its payload under ``index_key`` (``"seed"`` for N seeds of
        one prompt) and, for a command, in ``CORRAL_ARRAY_INDEX``. ``webhook``: as for
        ``submit_pipeline``."""
        return Group(
            self,
            self.run(
                groups.submit_array(
                    job, count, index_key, index_start, idempotency_key or calls.new_key(), webhook
                )
            ),
        )

    def group(self, group_id: str) -> Group:
        """A handle on an existing pipeline (``pipe_...``) or array (``arr_...``)."""
        return Group(self, self.run(groups.get(group_id)))

    def groups(self, kind: str = "pipeline", limit: int = 20) -> list[Group]:
        """The newest pipelines (``kind="array"``: arrays) the token sees."""
        return [Group(self, s) for s in self.run(groups.listing(kind, limit))]

    def upload_input(self, source: str | Path | bytes, name: str | None = None) -> InputFile:
        """Upload a file for jobs to read (``POST /v1/inputs``); name it in a job's
        ``inputs`` with ``.ref()``. ``name`` defaults to the file's name."""
        if isinstance(source, bytes):
            if not name:
                raise ClientError("name the bytes you upload: upload_input(data, name)")
            return self.run(inputs.upload(source, name))
        path = Path(source)
        return self.run(inputs.upload(path.read_bytes(), name or path.name))

    def input_file(self, blob: str) -> InputFile:
        """One of the team's input files."""
        return self.run(inputs.get(blob))

    def delete_input(self, blob: str) -> None:
        """Forget an input file (its bytes go once no team holds them)."""
        self.run(inputs.delete(blob))

    def job(self, job_id: str) -> Job:
        """A handle on an existing job (raises ``NotFound`` if the token cannot see it)."""
        return Job(self, self.run(calls.get_job(job_id)))

    def jobs(
        self,
        *,
        state: str | Sequence[str] | None = None,
        team: str | None = None,
        user: str | None = None,
        limit: int = 50,
    ) -> list[JobStatus]:
        """Jobs newest first, filtered; follows pages until ``limit`` jobs are read."""
        return list(self.iter_jobs(state=state, team=team, user=user, limit=limit))

    def iter_jobs(
        self,
        *,
        state: str | Sequence[str] | None = None,
        team: str | None = None,
        user: str | None = None,
        limit: int | None = None,
    ) -> Iterator[JobStatus]:
        """Like ``jobs`` but lazy, page by page; ``limit=None`` reads them all."""
        states = [state] if isinstance(state, str) else list(state or ())
        cursor: str | None = None
        left = limit
        while left is None or left > 0:
            size = calls.MAX_PAGE if left is None else left
            page = self.run(
                calls.list_jobs(states=states, team=team, user=user, limit=size, cursor=cursor)
            )
            yield from page.jobs
            if left is not None:
                left -= len(page.jobs)
            cursor = page.next_cursor
            if not cursor or not page.jobs:
                return

    def queue(self, limit: int = 100) -> QueueStatus:
        """Queued jobs in the scheduler's order, each with why it waits."""
        return self.run(calls.queue(limit))

    # -- nodes, teams, tokens ------------------------------------------------------------

    def autoscaler(self) -> AutoscalerStatus:
        """The autoscaler's pools, its machines and its last decision (admin)."""
        return self.run(calls.autoscaler())

    def nodes(self) -> list[NodeStatus]:
        return self.run(calls.list_nodes())

    def node(self, name: str) -> NodeStatus:
        return self.run(calls.get_node(name))

    def pause_node(self, name: str) -> NodeStatus:
        """No new work on ``name``; what runs there keeps running (admin)."""
        return self.run(calls.node_action(name, "pause"))

    def resume_node(self, name: str) -> NodeStatus:
        """Take new work again; clears paused and draining (admin)."""
        return self.run(calls.node_action(name, "resume"))

    def drain_node(self, name: str) -> NodeStatus:
        """No new work; the node can go once its work ends (admin)."""
        return self.run(calls.node_action(name, "drain"))

    def delete_node(self, name: str) -> None:
        """Forget a node that is gone (admin). ``Conflict`` unless it is lost: its agent
        stopped and was not heard from for the server's node timeout."""
        self.run(calls.delete_node(name))

    def health(self) -> dict[str, Any]:
        return self.run(calls.health())

    # -- models (the registry, see corral.sdk.registry) ---------------------------------

    def models(self) -> list[ModelInfo]:
        """Registered models, each with the nodes that hold it (``.cached``)."""
        return self.run(registry.list_models())

    def model(self, name: str) -> ModelInfo:
        return self.run(registry.get_model(name))

    def add_model(
        self,
        name: str,
        *,
        sources: Sequence[str] = (),
        file: str | None = None,
        size: int | str | None = None,
        sha256: str | None = None,
        kind: str = "checkpoint",
        backend: str = "",
        progress: Progress | None = None,
    ) -> ModelInfo:
        """Register (or replace) a model (admin). ``sources``: http(s) URLs agents fetch,
        or a file on the server; ``file``: a local file to upload (resumed if cut off)."""
        if file is not None:
            return add_local_file(
                self, name, file, sources=sources, sha256=sha256, kind=kind, backend=backend,
                progress=progress,
            )  # fmt: skip
        body = registry.registration(sources, size, sha256, kind, backend)
        return self.run(registry.put_model(name, body))

    def remove_model(self, name: str) -> None:
        """Remove a model from the registry (admin)."""
        self.request("DELETE", f"/v1/models/{name}")

    # -- plumbing used by Job ------------------------------------------------------------

    def result_status(self, job_id: str) -> ResultStatus:
        return self.run(calls.result(job_id))

    def stop_job(self, job_id: str, how: str) -> JobStatus:
        return self.run(calls.stop(job_id, how))

    def edit_job(
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
        """Change a queued job: its priority class, time limit or labels; ``hold=True``
        keeps it queued but never placed, ``hold=False`` releases it; ``top`` makes it its
        user's next job; ``user_weight`` sets its user's weight (admin: a new policy version).
        ``Conflict`` once it is no longer queued."""
        change = calls.edits(priority, timeout_s, labels, hold, top, user_weight)
        return self.run(calls.edit_job(job_id, change))

    def deliveries(self, job_id: str, limit: int = 100) -> list[Delivery]:
        """The job's webhook calls, each with its attempts."""
        return self.run(calls.deliveries(job_id, limit))

    def webhook_secret(self, team: str | None = None, *, rotate: bool = False) -> str:
        """The secret that signs your team's webhook calls (``rotate``: make a new one)."""
        return self.run(calls.webhook_secret(team, rotate))

    def delete_job(self, job_id: str) -> None:
        """Delete a finished job now, with its events, results and previews (the server's
        retention does it after 30 days). ``Conflict`` while it is queued or running."""
        self.run(calls.delete_job(job_id))

    def download(self, path: str) -> bytes:
        """The bytes at an API path (a result file's or a preview's ``url``)."""
        return self.request("GET", path).content

    def events(
        self,
        job_id: str,
        *,
        after: int = 0,
        idle_timeout: float | None = None,
        kinds: Iterable[str] = (),
    ) -> EventStream:
        """Follow a job's events (see ``Job.events``)."""
        follow = Follow(
            job_id, self.url, self.retry, last=after, idle_timeout=idle_timeout, kinds=tuple(kinds)
        )
        return EventStream(self.stream_events(follow), follow)

    def run(self, call: calls.Call[T]) -> T:
        """Send one ``Call`` (with retries) and parse its answer."""
        response = self.request(
            call.method,
            call.path,
            params=call.params,
            headers=call.headers,
            **({"json": call.json} if call.content is None else {"content": call.content}),
        )
        return call.parse(response.json() if response.content else None)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request, retried on connection errors and 502/503/504; errors raise."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(method, path, **kw)
            except httpx.UnsupportedProtocol as exc:
                raise ClientError(f"bad server URL {self.url!r}: {exc}") from None
            except RETRYABLE as exc:
                delay = self.retry.delay(attempt)
                if delay is None:
                    raise self._unreachable(exc, attempt) from exc
                time.sleep(delay)
                continue
            if response.status_code in RETRY_STATUSES:
                delay = self.retry.delay(attempt)
                if delay is not None:
                    time.sleep(delay)
                    continue
            if response.status_code >= 400:
                raise api_error(response)
            return response

    def _unreachable(self, exc: BaseException, attempts: int) -> ServerUnreachable:
        where = "" if self.url_from in ("--url", "default") else f" (from {self.url_from})"
        return ServerUnreachable(self.url + where, describe(exc), attempts=attempts)

    def stream_events(self, follow: Follow) -> Generator[JobEvent, None, None]:
        """Events of one job across reconnections, until its final event."""
        while True:
            try:
                for event in self._stream_once(follow):
                    follow.seen(event.seq, time.monotonic())
                    yield event
                    if event.terminal:
                        return
            except RETRYABLE as exc:
                delay = follow.broken(exc, time.monotonic())
                if delay is None:
                    return
                time.sleep(delay)
                continue
            # A clean end without the final event: resumed past it, or the server went away.
            if self.run(calls.get_job(follow.job_id)).done:
                return
            time.sleep(follow.ended_early())

    def _stream_once(self, follow: Follow) -> Iterator[JobEvent]:
        timeout = httpx.Timeout(10.0, read=follow.read_timeout(time.monotonic()))
        path = calls.events_path(follow.job_id)
        with self._http.stream(
            "GET", path, params=follow.params(), headers=follow.headers(), timeout=timeout
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise api_error(resp)
            decoder = SseDecoder()
            for line in resp.iter_lines():
                event = decoder.feed(line)
                if event is not None and event.seq > follow.last:
                    yield event
