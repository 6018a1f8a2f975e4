"""The ComfyUI executor: a workflow through ``/prompt``, followed on ``/ws``.

A job's payload is ``{"workflow": {...}}``, a graph in ComfyUI's API format.
The executor opens the websocket first (``/ws?clientId=...``, so no message is
missed), submits with a ``prompt_id`` it chose itself (so it never depends on
the answer to know its prompt), then turns ``progress`` messages and binary
preview frames into updates until ``execution_success``, ``execution_error`` or
``execution_interrupted``. The outputs come from ``/history/{id}`` and ``/view``:
every file an output node saved, whatever its kind (``images``, ``latents``,
``gifs`` and videos of video nodes, ``audio``; not ``temp`` previews), and
``comfyui-outputs.json``, which says each file's node, kind and subfolder
(``comfyui_outputs.py``). With a results folder (``JobWork.scratch_dir``)
each is streamed into it and sent from there, so a long video never sits in the
agent's memory. A cached result whose file is gone is run again, not failed.

A graph ComfyUI refuses (400) fails with its reasons, node by node (node id,
class, input, message); when the only reasons are model files the backend does not
have (``value_not_in_list`` of ``ckpt_name``, ``lora_name``, ``vae_name`` ...) the
failure is retryable and names them (``model_names.lacking``): another node may
have them. A graph of which ComfyUI would run only some outputs (200 with
``node_errors``) is taken back off its queue and fails the same way: a job never
succeeds while outputs it asked for were dropped.

A websocket drop loses messages, so the executor then reconciles through
``/history`` (which holds the outcome once the prompt ended) while it
reconnects. A stop posts ``/interrupt`` for its prompt and deletes it from the
queue if it had not started; an interrupt keeps the outputs already saved.

Input files of the job are uploaded first and the graph pointed at them
(``comfyui_inputs.py``). Samplers are split in segments whose latents become
the job's checkpoints, and a resumed attempt runs only the steps left
(``comfyui_segments.py``, ``comfyui_resume.py``). When the job names a model, every
``CheckpointLoaderSimple`` loads it; when it names none, the checkpoint the
workflow used is reported in ``modified``.
Progress messages read ``node <id>: <value>/<max>`` (ComfyUI's own figures).
A payload ``{"mode": "catalog"}`` runs nothing: it answers ``catalog.json``
with the backend's ``object_info`` and ``embeddings``.

Over 400 lines on purpose: one prompt's life (submit, follow the socket, collect outputs,
rerun from a stale cache, stop) reads top to bottom; refusals, inputs, outputs, messages
and segments live in their own ``comfyui_*`` modules.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from corral.agent.executors.base import (
    Failed,
    Finished,
    JobWork,
    LogLine,
    Progress,
    Result,
    StopSignal,
    Update,
    stopped_terminal,
)
from corral.agent.executors.comfyui_inputs import upload_inputs
from corral.agent.executors.comfyui_messages import error_text as _error_text
from corral.agent.executors.comfyui_messages import json_body as _json
from corral.agent.executors.comfyui_messages import names as _names
from corral.agent.executors.comfyui_messages import preview as _preview
from corral.agent.executors.comfyui_outputs import (
    OutputGone,
    fetch_outputs,
    rerun_outputs,
    saved_files,
    unique,
)
from corral.agent.executors.comfyui_refusals import dropped as _dropped
from corral.agent.executors.comfyui_refusals import lacks as _lacks
from corral.agent.executors.comfyui_refusals import refusal as _refusal
from corral.agent.executors.comfyui_resume import save_checkpoint, segment_steps, segmented
from corral.agent.executors.comfyui_segments import Range, Segmented
from corral.agent.executors.http_common import backend_errors, check_response
from corral.agent.executors.model_files import install
from corral.core import Clock, ExecutorError, InvalidSpec

LOADERS = ("CheckpointLoaderSimple",)
FINAL = ("execution_success", "execution_error", "execution_interrupted")


@dataclass
class _Watch:
    """What one prompt's messages told so far."""

    prompt_id: str
    samplers: int
    plan: Segmented
    job: JobWork
    node_progress: dict[str, float] = field(default_factory=dict)
    saved: list[tuple[Range, dict[str, Any]]] = field(default_factory=list)  # latents to fetch
    timing: tuple[float, int] | None = None  # (when, step) of the first progress measured
    step_s: float | None = None
    reported: float = 0.0
    outcome: str | None = None  # "success" | "error" | "interrupted"
    error: str = ""
    ended: bool = False  # its history is written: outputs can be fetched

    def progress(self, node: str, value: int, maximum: int) -> Progress | None:
        where = self.plan.segments.get(node)
        if where is not None:  # a segment's own count: its place in the whole run
            node, value, maximum = where.sampler, where.start + value, where.total
        self.node_progress[node] = value / maximum if maximum else 0.0
        overall = sum(self.node_progress.values()) / max(self.samplers, len(self.node_progress))
        fraction = min(0.99, max(self.reported, overall))  # 1.0 only once outputs are in
        if fraction <= self.reported and value < maximum:
            return None
        self.reported = fraction
        return Progress(fraction, value, maximum, f"node {node}: {value}/{maximum}")


class ComfyUIExecutor:
    """Drives one ComfyUI server at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        clock: Clock,
        *,
        request_timeout_s: float = 30.0,
        reconcile_interval_s: float = 1.0,
        name: str = "comfyui",
        models_dir: Path | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._models_dir = models_dir  # its models/checkpoints: registered models go there
        self._loaded: str | None = None  # the checkpoint it last loaded (ComfyUI keeps it)
        self._ws_url = "ws" + self._base_url.removeprefix("http") + "/ws"
        self._clock = clock
        self._timeout = request_timeout_s
        self._reconcile_s = reconcile_interval_s
        self._name = name
        self._step_s: float | None = None  # its backend's last measured sampling step

    @property
    def name(self) -> str:
        return self._name

    def loaded(self) -> tuple[str, ...]:
        """The checkpoint ComfyUI last loaded (it stays in GPU memory until another is)."""
        return (self._loaded,) if self._loaded else ()

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        if assignment.payload.get("mode") == "catalog":
            with backend_errors(self._name, self._base_url):
                async with httpx.AsyncClient(base_url=self._base_url, timeout=self._timeout) as c:
                    info = check_response(await c.get("/object_info"), self._name, "/object_info")
                    embeddings = await c.get("/embeddings")  # optional: older backends lack it
            listed = _names(embeddings)
            data = json.dumps({"object_info": info.json(), "embeddings": listed}).encode()
            yield Finished((Result("catalog.json", data, "application/json"),))
            return
        workflow, modified = _workflow(assignment.payload, self._checkpoint(assignment))
        every = segment_steps(assignment.payload, self._step_s)
        self._loaded = assignment.model or modified.get("model") or self._loaded
        if stop.requested is not None:
            yield stopped_terminal(stop.requested)
            return
        with backend_errors(self._name, self._base_url):
            async with httpx.AsyncClient(base_url=self._base_url, timeout=self._timeout) as client:
                workflow = await upload_inputs(client, workflow, assignment, self._name)
                plan = await segmented(client, workflow, assignment, self._name, every)
                for note in plan.notes:
                    yield LogLine(f"comfyui: {note}", "agent")
                if plan.resumed is not None:
                    step, total = plan.resumed.step, plan.segments[plan.resumed.node].total
                    yield LogLine(f"resuming sampling at step {step} of {total}", "agent")
                    yield Progress(step / total, step, total, f"resumed from step {step}")
                attempt = _Attempt(plan.graph, _count_samplers(workflow), plan, assignment)
                async for update in self._attempt(client, attempt, assignment, stop):
                    yield update
                if attempt.gone is not None and stop.requested is None:
                    yield LogLine(_rerun_note(attempt.gone), "agent")
                    graph = rerun_outputs(workflow, attempt.gone_nodes, uuid.uuid4().hex)
                    attempt = _Attempt(graph, attempt.samplers, Segmented(graph), assignment, True)
                    async for update in self._attempt(client, attempt, assignment, stop):
                        yield update
        if attempt.refused is not None:
            yield attempt.refused
            return
        if attempt.watch.outcome == "success" and stop.requested is None:
            yield Progress(1.0)
        yield _terminal(attempt.watch, stop, attempt.results, modified)

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        attempt: _Attempt,
        assignment: JobWork,
        stop: StopSignal,
    ) -> AsyncIterator[Update]:
        """Submit the graph once, follow it to its end and fetch what it saved."""
        client_id, watch = uuid.uuid4().hex, attempt.watch
        ws = await self._connect(client_id)  # before submitting: miss no message
        body = {"prompt": attempt.workflow, "client_id": client_id, "prompt_id": watch.prompt_id}
        try:
            attempt.refused = await self._submit(client, body)
        except BaseException:
            await ws.close()
            raise
        if attempt.refused is not None:
            await ws.close()
            return
        async for update in self._follow(ws, client, client_id, watch, stop):
            yield update
        self._step_s = watch.step_s or self._step_s
        outputs = (await self._history(client, watch.prompt_id)).get("outputs", {})
        outputs = {k: v for k, v in outputs.items() if k not in watch.plan.latents}
        try:
            attempt.results = await fetch_outputs(
                client, outputs, assignment.scratch_dir, self._name
            )
        except OutputGone as gone:
            if attempt.rerun:
                raise ExecutorError(
                    f"{self._name}: {gone} is not on the backend even after running the "
                    "graph again (/view answers 404)",
                    retryable=True,
                ) from None
            attempt.gone = gone
            attempt.gone_nodes = {str(n) for n in outputs}

    async def _submit(self, client: httpx.AsyncClient, body: dict[str, Any]) -> Failed | None:
        """``POST /prompt``; a Failed naming ComfyUI's reasons when it refused the graph
        (400) or dropped some of its outputs (200 with ``node_errors``: ComfyUI would run
        the others, so the prompt is taken back off its queue first)."""
        response = await client.post("/prompt", json=body)
        answer = _json(response)
        node_errors = answer.get("node_errors") if isinstance(answer, dict) else None
        if response.status_code == 400 and isinstance(answer.get("error"), dict):
            refusal = _refusal(answer["error"], node_errors)
            return _lacks(self._name, node_errors, refusal) or Failed(refusal, retryable=False)
        check_response(response, self._name, "/prompt")
        if not node_errors or not isinstance(node_errors, dict):
            return None
        prompt_id = body["prompt_id"]
        await client.post("/queue", json={"delete": [prompt_id]})
        await client.post("/interrupt", json={"prompt_id": prompt_id})
        dropped = _dropped(node_errors)
        return _lacks(self._name, node_errors, dropped) or Failed(dropped, retryable=False)

    def _checkpoint(self, assignment: JobWork) -> str | None:
        """The ``ckpt_name`` to load: a model from the agent's cache is linked into
        ComfyUI's checkpoint folder first (ComfyUI sees new files there by itself)."""
        if assignment.model is None or assignment.model_path is None or not self._models_dir:
            return assignment.model
        return install(self._models_dir, assignment.model, assignment.model_path)

    async def _connect(self, client_id: str) -> ClientConnection:
        try:
            return await connect(
                f"{self._ws_url}?clientId={client_id}",
                max_size=64 << 20,
                open_timeout=self._timeout,
            )
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise ExecutorError(
                f"{self._name} backend at {self._base_url} is unreachable ({exc}); is it running?",
                retryable=True,
            ) from exc

    async def _follow(
        self,
        ws: ClientConnection | None,
        client: httpx.AsyncClient,
        client_id: str,
        watch: _Watch,
        stop: StopSignal,
    ) -> AsyncIterator[Update]:
        """Updates from the websocket until the prompt ends; reconcile after a drop."""
        interrupted = False
        try:
            while not watch.ended and ws is not None:
                if stop.requested is not None and not interrupted:
                    interrupted = True
                    await client.post("/interrupt", json={"prompt_id": watch.prompt_id})
                    await client.post("/queue", json={"delete": [watch.prompt_id]})
                try:
                    quiet = interrupted or watch.outcome is not None
                    message = await self._receive(ws, stop, quiet)
                except ConnectionClosed:
                    yield LogLine("websocket dropped; reconciling through /history", "agent")
                    ws = await self._reconcile(client, client_id, watch)
                    continue
                if message is None:
                    await self._settle(client, watch, interrupted)
                    continue
                update = _read(message, watch)
                if update is not None:
                    self._time(watch, update)
                    yield update
                while watch.saved:
                    where, entry = watch.saved.pop(0)
                    saved = await save_checkpoint(client, entry, where, watch.job, self._name)
                    if saved is not None:
                        yield saved
        finally:
            if ws is not None:
                await ws.close()

    def _time(self, watch: _Watch, update: Update) -> None:
        """Measure the backend's step time (it sizes the next jobs' segments)."""
        if not isinstance(update, Progress) or not update.total:
            return
        now = self._clock.now()
        if watch.timing is None or update.step <= watch.timing[1]:
            watch.timing = (now, update.step)  # the first step, or another sampler's
        else:
            watch.step_s = (now - watch.timing[0]) / (update.step - watch.timing[1])

    async def _receive(
        self, ws: ClientConnection, stop: StopSignal, quiet: bool
    ) -> str | bytes | None:
        """The next message; None when a stop arrives, or (``quiet``) when none came for a while.

        Cancelling ``recv`` loses no message (websockets' asyncio client guarantees it).
        """
        receive = asyncio.ensure_future(ws.recv())
        waiting = self._clock.sleep(self._reconcile_s) if quiet else stop.wait()
        other = asyncio.ensure_future(waiting)
        try:
            await asyncio.wait({receive, other}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            other.cancel()
            if not receive.done():
                receive.cancel()
        if receive.done() and not receive.cancelled():
            return receive.result()
        return None

    async def _reconcile(
        self, client: httpx.AsyncClient, client_id: str, watch: _Watch
    ) -> ClientConnection | None:
        """After a drop: the outcome from /history if it ended, else a new websocket."""
        while True:
            if _history_outcome(await self._history(client, watch.prompt_id), watch):
                return None
            try:
                ws = await self._connect(client_id)
            except ExecutorError:
                await self._clock.sleep(self._reconcile_s)
                continue
            # it may have ended while we were away, its last messages lost: look again
            if _history_outcome(await self._history(client, watch.prompt_id), watch):
                await ws.close()
                return None
            return ws

    async def _settle(self, client: httpx.AsyncClient, watch: _Watch, interrupted: bool) -> None:
        """Things went quiet: it ended (history has it), or, interrupted, never started."""
        if _history_outcome(await self._history(client, watch.prompt_id), watch):
            return
        if interrupted and not await self._queued_or_running(client, watch.prompt_id):
            watch.outcome, watch.ended = "interrupted", True

    async def _queued_or_running(self, client: httpx.AsyncClient, prompt_id: str) -> bool:
        queue = check_response(await client.get("/queue"), self._name, "/queue").json()
        entries = queue.get("queue_running", []) + queue.get("queue_pending", [])
        return any(len(e) > 1 and e[1] == prompt_id for e in entries)

    async def _history(self, client: httpx.AsyncClient, prompt_id: str) -> dict[str, Any]:
        response = check_response(await client.get(f"/history/{prompt_id}"), self._name, "/history")
        entry = response.json().get(prompt_id)
        return entry if isinstance(entry, dict) else {}


_saved_files, _unique = saved_files, unique  # the names its tests know


@dataclass
class _Attempt:
    """One submission of the graph: its watch, its results, or why it did not run
    (``refused``), or the cached output that was gone (``gone``: run it again)."""

    workflow: dict[str, Any]
    samplers: int
    plan: Segmented
    job: JobWork
    rerun: bool = False
    watch: _Watch = field(init=False)
    refused: Failed | None = None
    results: tuple[Result, ...] = ()
    gone: OutputGone | None = None
    gone_nodes: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.watch = _Watch(str(uuid.uuid4()), self.samplers, self.plan, self.job)


def _rerun_note(gone: OutputGone) -> str:
    return (
        f"comfyui answered from its cache but {gone} is gone from /view; "
        f"running those output nodes again"
    )


def _workflow(
    payload: Mapping[str, Any], model: str | None
) -> tuple[dict[str, Any], dict[str, str]]:
    workflow = payload.get("workflow")
    if not isinstance(workflow, Mapping) or not workflow:
        raise InvalidSpec(
            "payload.workflow", "must be a ComfyUI workflow in API format (an object of nodes)"
        )
    graph = json.loads(json.dumps(workflow))  # a private deep copy
    loaders = [n for n in graph.values() if isinstance(n, dict) and n.get("class_type") in LOADERS]
    if model is not None:
        for node in loaders:
            node.setdefault("inputs", {})["ckpt_name"] = model
        return graph, {}
    used = sorted({str(n.get("inputs", {}).get("ckpt_name")) for n in loaders})
    return graph, ({"model": ",".join(used)} if used else {})


def _count_samplers(workflow: Mapping[str, Any]) -> int:
    kinds = [str(n.get("class_type", "")) for n in workflow.values() if isinstance(n, dict)]
    return max(1, sum("Sampler" in k for k in kinds))


def _read(message: str | bytes, watch: _Watch) -> Update | None:
    """One websocket message as an update (or None), noting the outcome in ``watch``."""
    if isinstance(message, bytes):
        return _preview(message)
    event = json.loads(message)
    kind, data = event.get("type"), event.get("data") or {}
    if data.get("prompt_id") not in (None, watch.prompt_id):
        return None  # another client's prompt
    if kind == "progress":
        return watch.progress(str(data.get("node")), int(data["value"]), int(data["max"]))
    if kind == "execution_error":
        watch.outcome, watch.error = "error", _error_text(data)
    elif kind == "execution_interrupted":
        watch.outcome = "interrupted"
    elif kind == "execution_success":
        watch.outcome = "success"
    elif kind == "executed" and str(data.get("node")) in watch.plan.latents:
        for entry in (data.get("output") or {}).get("latents", []):
            watch.saved.append((watch.plan.latents[str(data.get("node"))], entry))
    elif kind == "executing" and data.get("node") is None and "prompt_id" in data:
        watch.ended = True  # sent after the history entry is written
        watch.outcome = watch.outcome or "success"
    return None


def _history_outcome(entry: dict[str, Any], watch: _Watch) -> bool:
    """Read a finished prompt's outcome from its history entry; False while it runs."""
    status = entry.get("status")
    if not entry or not isinstance(status, dict):
        return False
    for kind, data in status.get("messages", []):
        if kind in FINAL:
            _read(json.dumps({"type": kind, "data": {**data, "prompt_id": watch.prompt_id}}), watch)
    watch.outcome = watch.outcome or (
        "success" if status.get("status_str") == "success" else "error"
    )
    return True


def _terminal(
    watch: _Watch, stop: StopSignal, results: tuple[Result, ...], modified: dict[str, str]
) -> Update:
    if stop.requested is not None:
        return stopped_terminal(stop.requested, results, modified)
    if watch.outcome == "error":
        return Failed(f"comfyui: {watch.error or 'the prompt failed'}", retryable=False)
    if watch.outcome == "interrupted":  # someone else interrupted it (the ComfyUI UI)
        return Failed("comfyui: the prompt was interrupted on the backend", retryable=True)
    return Finished(results, modified)
