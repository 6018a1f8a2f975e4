"""The ComfyUI API on a whole cluster: a prompt becomes a job, its prompt_id the job's key.

``POST /prompt`` submits a job (backend ``comfyui``, payload ``{"workflow",
"client_id", "prompt_id"}``) under the idempotency key ``comfyui:<prompt_id>``:
a caller-chosen ``prompt_id`` is honoured, and sending it again returns the
same prompt instead of running it twice (a different graph under a used id is
refused). The graph is validated as ComfyUI validates it (``corral.core.comfyui``,
against a connected backend's ``object_info``): a graph with no valid output is
refused with ComfyUI's own 400; one with some is answered 200 with the others'
``node_errors`` and runs without them, as ComfyUI runs it. ``/history``,
``/queue`` and ``/view`` read the caller's jobs back in ComfyUI's shapes;
outputs are served from the job's results, with the job id as the first part of
``subfolder`` (then the subfolder the backend saved in) so file names from
different backends never clash; each file is listed under its node and kind as
the backend listed it (the job's ``comfyui-outputs.json``).
"""

from __future__ import annotations

import contextlib
import json
import mimetypes
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from corral.core.comfyui import MODEL_LISTS, OUTPUTS_MANIFEST, validate_prompt
from corral.core.comfyui import error as comfy_error
from corral.core.errors import Conflict, NotFound
from corral.core.states import JobState
from corral.server.services.compat import Caller, CompatJobs, Submission, Unservable
from corral.server.services.compat_catalog import CatalogCache
from corral.server.services.compat_comfyui_uploads import (
    ComfyUploads,
    backend_images,
    job_inputs,
)
from corral.server.store import jobs as job_repo
from corral.server.store.records import JobRecord

BACKEND = "comfyui"
LOADERS = {"CheckpointLoaderSimple": "ckpt_name"}  # whose input names a checkpoint
ACTIVE = (JobState.QUEUED, JobState.PLACED, JobState.RUNNING)


class PromptRejected(Exception):
    """``/prompt`` refused, in ComfyUI's shape: ``{"error": {...}, "node_errors": {...}}``."""

    def __init__(self, error: dict[str, Any], node_errors: dict[str, Any] | None = None) -> None:
        super().__init__(error.get("message", "invalid prompt"))
        self.body = {"error": error, "node_errors": node_errors or {}}


def prompt_key(prompt_id: str) -> str:
    return f"comfyui:{prompt_id}"


class ComfyService:
    def __init__(self, jobs: CompatJobs, catalogs: CatalogCache) -> None:
        self.jobs = jobs
        self.catalogs = catalogs
        self.described: Callable[[Caller], Awaitable[dict[str, Any]]] | None = None
        self.uploads = ComfyUploads(jobs.plane.rt, jobs.plane.inputs)  # /upload/image

    async def submit(
        self, caller: Caller, body: Mapping[str, Any], priority: str | None = None
    ) -> dict[str, Any]:
        """``POST /prompt``: queue the graph (once per prompt_id); ComfyUI's answer."""
        prompt = body.get("prompt")
        if not isinstance(prompt, dict) or not prompt:
            raise PromptRejected(comfy_error("no_prompt", "No prompt provided"))
        nodes = await self.jobs.backend_nodes(caller, BACKEND)
        info = await self._object_info(caller)
        files = await self.uploads.resolve(caller.principal, prompt)  # uploaded images it names
        prompt, node_errors = _validate(prompt, info, complete=len(nodes) == 1, files=files)
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        payload = {
            "workflow": prompt,
            "client_id": str(body.get("client_id") or ""),
            "prompt_id": prompt_id,
        }
        ckpts = {
            str(n["inputs"][k]) for n, k in _loaders(prompt) if isinstance(n["inputs"][k], str)
        }
        sub = Submission(
            BACKEND,
            payload,
            model=next(iter(ckpts)) if len(ckpts) == 1 else None,
            key=prompt_key(prompt_id),
            fingerprint=prompt,
            priority=priority,
            inputs=job_inputs(files, prompt),
        )
        try:
            rec, _ = await self.jobs.submit(caller, sub)
        except Conflict:
            raise PromptRejected(
                comfy_error(
                    "duplicate_prompt_id",
                    f"prompt_id {prompt_id} was already used for a different prompt",
                    prompt_id,
                )
            ) from None
        rec = await self.jobs.plane.jobs.get(caller.principal, rec.job.id)
        return {"prompt_id": prompt_id, "number": rec.seq, "node_errors": node_errors}

    async def _object_info(self, caller: Caller) -> dict[str, Any] | None:
        """What graphs are checked against: every node's node types (``described``, set by
        ``ComfyCluster``), else a catalog job's answer from one node."""
        try:
            if self.described is not None:
                return await self.described(caller)
            catalog = await self.catalogs.get(caller, BACKEND)
        except Unservable:
            raise
        except Exception:  # validation is best effort; the backend validates too
            return None
        info = catalog.data.get("object_info")
        return info if isinstance(info, dict) else None

    async def find(self, caller: Caller, prompt_id: str) -> JobRecord | None:
        """The caller's job for ``prompt_id`` (its team's), if any."""
        async with self.jobs.plane.rt.db.read() as conn:
            found = await job_repo.by_idempotency_keys(conn, caller.team, [prompt_key(prompt_id)])
        rec = found.get(prompt_key(prompt_id))
        return rec if rec is not None and caller.principal.sees(rec.job.team) else None

    async def history(self, caller: Caller, prompt_id: str) -> dict[str, Any]:
        """``/history/{id}``: the entry once the prompt ended, ``{}`` before (as ComfyUI)."""
        rec = await self.find(caller, prompt_id)
        if rec is None or rec.state in ACTIVE:
            return {}
        listed = any(f.name == OUTPUTS_MANIFEST for f in rec.result)
        manifest = await self.manifest(caller, rec.job.id) if listed else None
        return {prompt_id: history_entry(rec, manifest)}

    async def manifest(self, caller: Caller, job_id: str) -> dict[str, Any] | None:
        """The job's ``comfyui-outputs.json`` (how the backend listed its outputs), if any."""
        try:
            _, data = await self.jobs.plane.jobs.result_file(
                caller.principal, job_id, OUTPUTS_MANIFEST
            )
            found = json.loads(data)
        except (NotFound, ValueError):
            return None
        return found if isinstance(found, dict) else None

    async def queue(self, caller: Caller) -> dict[str, Any]:
        """``/queue``: the caller's team's prompts that run and wait."""
        page = await self.jobs.plane.jobs.page(caller.principal, states=ACTIVE, limit=500)
        mine = [r for r in reversed(page.jobs) if _is_prompt(r)]
        running = [queue_item(r) for r in mine if r.state is JobState.RUNNING]
        pending = [queue_item(r) for r in mine if r.state is not JobState.RUNNING]
        return {"queue_running": running, "queue_pending": pending}

    async def interrupt(self, caller: Caller, prompt_id: str | None) -> None:
        """Interrupt that prompt, or every running prompt of this caller."""
        if prompt_id:
            rec = await self.find(caller, prompt_id)
            if rec is not None:
                await self.jobs.interrupt(caller, rec.job.id)
            return
        page = await self.jobs.plane.jobs.page(
            caller.principal, states=(JobState.RUNNING,), user=caller.user, limit=500
        )
        for rec in page.jobs:
            if _is_prompt(rec):
                await self.jobs.interrupt(caller, rec.job.id)

    async def delete(self, caller: Caller, prompt_ids: Iterable[str]) -> None:
        """``POST /queue {"delete": [...]}``: drop waiting prompts (running ones go on)."""
        for prompt_id in prompt_ids:
            rec = await self.find(caller, str(prompt_id))
            if rec is not None and rec.state in (JobState.QUEUED, JobState.PLACED):
                with contextlib.suppress(Conflict):  # it started or ended meanwhile
                    await self.jobs.plane.jobs.cancel(caller.principal, rec.job.id)

    async def view(self, caller: Caller, filename: str, subfolder: str) -> tuple[bytes, str]:
        """``/view``: an output file; ``subfolder`` is the job that made it."""
        job_id = subfolder.split("/", 1)[0]
        if not job_id.startswith("job_"):
            raise NotFound(f"no output {filename!r} in {subfolder!r}")
        f, data = await self.jobs.plane.jobs.result_file(caller.principal, job_id, filename)
        return data, f.content_type


def _validate(
    prompt: dict[str, Any],
    info: dict[str, Any] | None,
    *,
    complete: bool,
    files: Mapping[str, str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The graph to run and the ``node_errors`` of the outputs dropped from it, or a
    ``PromptRejected`` with ComfyUI's 400 when no output is valid.

    ``info`` is one node's ``object_info``: its model lists are checked only when that
    node is the only one (``complete``); else another node may have the model (the job
    then goes there: a backend that lacks it refuses it and the job fails over). An image
    a ``LoadImage`` names must be one of ``files``, the caller's uploads, or a file the
    backend lists in its own input folder.
    """
    if info is None:
        return prompt, {}  # best effort: the backend validates too
    graph = json.loads(json.dumps(prompt))  # validation converts values in place
    listed = backend_images(info)
    checked = validate_prompt(
        graph,
        info,
        unchecked_lists=() if complete else MODEL_LISTS,
        files=lambda name: name in files or name in listed,
    )
    if checked.error is not None:
        raise PromptRejected(checked.error, checked.node_errors)
    dropped = {o for e in checked.node_errors.values() for o in e["dependent_outputs"]}
    return {k: v for k, v in graph.items() if k not in dropped}, checked.node_errors


def _inputs(node: Any) -> Mapping[str, Any]:
    inputs = node.get("inputs") if isinstance(node, dict) else None
    return inputs if isinstance(inputs, dict) else {}


def _loaders(prompt: Mapping[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(node, input name) of every checkpoint loader in the graph."""
    return [
        (n, LOADERS[n["class_type"]])
        for n in prompt.values()
        if isinstance(n, dict)
        and n.get("class_type") in LOADERS
        and LOADERS[n["class_type"]] in _inputs(n)
    ]


def _is_prompt(rec: JobRecord) -> bool:
    return rec.job.backend == BACKEND and "prompt_id" in rec.job.payload


def output_nodes(workflow: Mapping[str, Any]) -> list[str]:
    """Nodes that save images (they have a ``filename_prefix``), in id order."""
    ids = [k for k, n in workflow.items() if "filename_prefix" in _inputs(n)]
    return sorted(ids, key=lambda k: (len(k), k))


def outputs_for(
    workflow: Mapping[str, Any],
    names: Iterable[str],
    job_id: str,
    manifest: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """History ``outputs``: as the backend listed them (``manifest``, the job's
    ``comfyui-outputs.json``), else each result under the saving node whose prefix it has."""
    if manifest is not None and isinstance(manifest.get("outputs"), Mapping):
        return _listed(manifest["outputs"], job_id)
    names = [n for n in names if n != OUTPUTS_MANIFEST]
    savers = output_nodes(workflow) or sorted(workflow, key=lambda k: (len(k), k))[-1:]
    outputs: dict[str, Any] = {}
    for name in sorted(names):
        node = next(
            (
                k
                for k in savers
                if name.startswith(str(_inputs(workflow[k]).get("filename_prefix", "")) + "_")
            ),
            savers[0] if savers else "0",
        )
        entry = {"filename": name, "subfolder": job_id, "type": "output"}
        kind = _output_kind(workflow.get(node), name)
        if kind == "gifs":  # VideoHelperSuite lists its files with their type
            entry["format"] = mimetypes.guess_type(name)[0] or "video/mp4"
        outputs.setdefault(node, {}).setdefault(kind, []).append(entry)
    return outputs


def _listed(outputs: Mapping[str, Any], job_id: str) -> dict[str, Any]:
    """The backend's own ``outputs``, each file pointing at the job's result: ``filename``
    the result's name, ``subfolder`` the job, then the backend's subfolder."""
    listed: dict[str, Any] = json.loads(json.dumps(outputs))
    for shown in listed.values():
        for value in shown.values() if isinstance(shown, dict) else ():
            for entry in value if isinstance(value, list) else ():
                if isinstance(entry, dict) and "result" in entry:
                    sub = str(entry.get("subfolder") or "")
                    entry["filename"] = str(entry.pop("result"))
                    entry["subfolder"] = f"{job_id}/{sub}" if sub else job_id
    return listed


def _output_kind(node: object, name: str) -> str:
    """The key a file is listed under, as the node that saved it lists it: ``gifs`` for
    VideoHelperSuite's nodes, ``audio`` for sound, ``images`` for the rest."""
    if isinstance(node, Mapping) and str(node.get("class_type", "")).startswith("VHS_"):
        return "gifs"
    if (mimetypes.guess_type(name)[0] or "").startswith("audio/"):
        return "audio"
    return "images"


def queue_item(rec: JobRecord) -> list[Any]:
    p = rec.job.payload
    workflow = dict(p.get("workflow") or {})
    # ComfyUI's extra_data: the client, and when it was queued (ms; its /jobs sorts by it)
    extra = {"client_id": p.get("client_id", ""), "create_time": int(rec.job.submitted_at * 1000)}
    return [rec.seq, p.get("prompt_id"), workflow, extra, output_nodes(workflow)]


def history_entry(rec: JobRecord, manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A finished prompt's history entry, ComfyUI's shape."""
    p = rec.job.payload
    workflow = json.loads(json.dumps(p.get("workflow") or {}))
    outputs = outputs_for(workflow, [f.name for f in rec.result], rec.job.id, manifest)
    ok = rec.state is JobState.SUCCEEDED and rec.stop_request != "interrupt"
    stamp = int((rec.started_at or rec.job.submitted_at) * 1000)
    base = {"prompt_id": p.get("prompt_id"), "timestamp": stamp}
    # ComfyUI's history keeps the messages it sent: start, cached, then how it ended
    messages: list[list[Any]] = [
        ["execution_start", base],
        ["execution_cached", {"nodes": [], **base}],
    ]
    if ok:
        messages.append(["execution_success", base])
    elif rec.state is JobState.FAILED:
        messages.append(["execution_error", {**base, **_error_keys(rec.error or "")}])
    else:
        messages.append(["execution_interrupted", {**base, "executed": list(outputs)}])
    return {
        "prompt": [*queue_item(rec)[:2], as_ran(workflow, rec), *queue_item(rec)[3:]],
        "outputs": outputs,
        "status": {
            "status_str": "success" if ok else "error",
            "completed": ok,
            "messages": messages,
        },
        "meta": {
            k: {"node_id": k, "display_node": k, "parent_node": None, "real_node_id": k}
            for k in outputs
        },
    }


def _error_keys(message: str) -> dict[str, Any]:
    """An ``execution_error``'s keys as ComfyUI's history has them; corral knows the
    message (the node the backend named is in it), not the failing node's inputs."""
    return {
        "node_id": "",
        "node_type": "",
        "executed": [],
        "exception_message": message,
        "exception_type": "corral.JobFailed",
        "traceback": [],
        "current_inputs": {},
        "current_outputs": {},
    }


def as_ran(workflow: dict[str, Any], rec: JobRecord) -> dict[str, Any]:
    """The graph as it ran (``workflow``, a private copy, changed in place): a job that
    names a model has the agent load it in every checkpoint loader, under the name its
    ``ran`` reports; the history's ``prompt`` shows that, as ComfyUI's shows what it ran."""
    model = (rec.ran or {}).get("model")
    if model and rec.job.model is not None:
        for node, key in _loaders(workflow):
            node["inputs"][key] = model
    return workflow
