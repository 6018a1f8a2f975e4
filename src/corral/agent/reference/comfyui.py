"""A reference ComfyUI server: the API the agent uses, faithfully.

What it shares with the real one (ComfyUI ``server.py`` / ``execution.py``):

* ``POST /prompt`` takes ``{"prompt", "client_id", "prompt_id"}``; a client-chosen
  ``prompt_id`` is honoured; the graph is validated as ComfyUI's ``validate_prompt``
  does (``corral.core.comfyui``): with no valid output left it is a 400 with
  ``error`` and ``node_errors``; with some, a 200 whose ``node_errors`` name the
  dropped outputs' errors, and only the valid outputs run; prompts run one at a
  time from a queue;
* outputs are cached as ComfyUI caches them (``comfyui_cache.py``): the same graph
  again runs nothing and lists the earlier files; ``POST /free`` with
  ``free_memory`` empties the cache;
* ``/ws?clientId=...`` sends ``status`` on connect, then for the client's prompts
  ``execution_start``, ``execution_cached``, ``executing``, ``progress``,
  ``executed``, ``execution_success`` (or ``execution_error`` /
  ``execution_interrupted``) and a final ``executing`` with ``node: null``;
* binary preview frames (``>I`` event 1 = preview image, ``>I`` format 1 = JPEG,
  then the JPEG) go to the running prompt's client, and only when the server was
  started with a preview method (``preview_method != "none"``);
* ``/upload/image`` and ``/upload/mask`` save files as ComfyUI does
  (``comfyui_uploads.py``: folders input/temp/output, subfolders, ``name (1).png``
  on a clash, overwrite); ``LoadImage`` lists and reads the input folder, and
  validates its image itself (ComfyUI's ``VALIDATE_INPUTS``);
* ``/history/{id}`` is filled when a prompt ends (outputs so far, status,
  messages), ``/view`` serves files of each folder (``type``, ``subfolder``),
  ``POST /interrupt`` (optionally for one ``prompt_id``) stops the running
  prompt, ``POST /queue`` deletes pending ones, ``/object_info`` describes the
  nodes;
* ``GET /models`` lists the model folders and ``GET /models/{folder}`` a folder's files
  (ComfyUI's ``model_files`` routes); ``CheckpointLoaderSimple``, ``LoraLoader`` and
  ``VAELoader`` offer those files, so a file it lacks is refused (``value_not_in_list``).

Faults for tests: ``step_delay_s`` (slow sampling), ``fail_next`` (the next
KSampler raises), ``slow_calls_s`` (late answers to ``/prompt``),
``drop_websockets()`` (every socket closes at once).

Over 400 lines on purpose: the server's routes, queue and socket are one ComfyUI; the nodes,
images, uploads, cache and sampling each live in their own ``comfyui_*`` module.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.agent.reference import comfyui_nodes as nodes
from corral.agent.reference.comfyui_cache import Entry, OutputCache
from corral.agent.reference.comfyui_uploads import Folders, upload
from corral.agent.reference.comfyui_workflows import two_branch_workflow, txt2img_workflow
from corral.core.comfyui import MODEL_FOLDERS, validate_prompt

__all__ = ["ReferenceComfyUI", "two_branch_workflow", "txt2img_workflow"]

PREVIEW_IMAGE = 1  # binary event type
JPEG = 1  # preview image format


class ReferenceComfyUI:
    """The server's state and routes. ``app`` is the ASGI application."""

    def __init__(  # noqa: PLR0913 (its folders and files, each one a test sets as a person would)
        self,
        *,
        preview_method: str = "none",
        checkpoints: tuple[str, ...] = ("tiny.safetensors", "tiny-v2.safetensors"),
        step_delay_s: float = 0.0,
        output_dir: Path | None = None,
        models_dir: Path | None = None,
        loras: tuple[str, ...] = ("tiny-lora.safetensors",),
        vaes: tuple[str, ...] = ("tiny-vae.safetensors",),
        embeddings: tuple[str, ...] = (),
        input_dir: Path | None = None,
    ) -> None:
        self.preview_method = preview_method
        self._checkpoints = checkpoints
        # its other model folders' files (tests add and remove files here, as a person would
        # in models/loras): listed by /models/{folder} and offered by the loaders' inputs
        self.files: dict[str, list[str]] = {
            "loras": list(loras),
            "vae": list(vaes),
            "embeddings": list(embeddings),
        }
        self.models_dir = models_dir  # its models/checkpoints: new files show up by themselves
        self.step_delay_s = step_delay_s
        self.fail_next: str | None = None
        self.slow_calls_s = 0.0  # HTTP answers come this late (an overloaded server)
        self.output_dir = output_dir or Path(tempfile.mkdtemp(prefix="comfyui-out-"))
        self.folders = Folders(
            (input_dir or Path(tempfile.mkdtemp(prefix="comfyui-in-"))).resolve(),
            Path(tempfile.mkdtemp(prefix="comfyui-temp-")).resolve(),  # emptied at each start
            self.output_dir.resolve(),
        )
        self.history: dict[str, dict[str, Any]] = {}
        self._queue: list[tuple[int, str, dict[str, Any], str, list[str]]] = []
        self.cache = OutputCache()
        self._number = 0
        self._running: str | None = None
        self._interrupt = threading.Event()
        self._sockets: dict[str, set[WebSocket]] = {}
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self.app = Starlette(
            routes=[
                Route("/prompt", self.post_prompt, methods=["POST"]),
                Route("/queue", self.get_queue, methods=["GET"]),
                Route("/queue", self.post_queue, methods=["POST"]),
                Route("/interrupt", self.interrupt, methods=["POST"]),
                Route("/free", self.free, methods=["POST"]),
                Route("/history/{prompt_id}", self.get_history, methods=["GET"]),
                Route("/view", self.view, methods=["GET"]),
                Route("/upload/image", self.upload_image, methods=["POST"]),
                Route("/upload/mask", self.upload_mask, methods=["POST"]),
                Route("/object_info", self.object_info, methods=["GET"]),
                Route("/embeddings", self.embeddings, methods=["GET"]),
                Route("/models", self.model_folders, methods=["GET"]),
                Route("/models/{folder}", self.model_files, methods=["GET"]),
                WebSocketRoute("/ws", self.websocket),
            ]
        )

    # ---- HTTP ----------------------------------------------------------------

    @property
    def checkpoints(self) -> tuple[str, ...]:
        """Its own checkpoints and the ``*.safetensors`` files in ``models_dir``."""
        found = (
            sorted(p.name for p in self.models_dir.glob("*.safetensors")) if self.models_dir else []
        )
        return (*self._checkpoints, *(f for f in found if f not in self._checkpoints))

    @checkpoints.setter
    def checkpoints(self, names: tuple[str, ...]) -> None:
        """Someone adds or deletes files in its models/checkpoints."""
        self._checkpoints = names

    def model_folders_files(self) -> dict[str, tuple[str, ...]]:
        """Every model folder's files, sorted as ``folder_paths.get_filename_list`` sorts
        them (folders it has no files in are empty; the checkpoints keep the reference's
        own order in ``/object_info``, which older tests quote)."""
        listed = {f: tuple(sorted(self.files.get(f, ()))) for f in MODEL_FOLDERS}
        return {**listed, "checkpoints": self.checkpoints}

    async def model_folders(self, request: Request) -> Response:
        """``GET /models``: the model folder names (ComfyUI's ``list_model_types``)."""
        return JSONResponse(list(MODEL_FOLDERS))

    async def model_files(self, request: Request) -> Response:
        """``GET /models/{folder}``: the file names in one folder, as the loaders' inputs list
        them; an unknown folder is a bare 404 (ComfyUI's ``get_models``)."""
        files = self.model_folders_files().get(request.path_params["folder"])
        return Response(status_code=404) if files is None else JSONResponse(sorted(files))

    async def post_prompt(self, request: Request) -> Response:
        await asyncio.sleep(self.slow_calls_s)
        body = await request.json()
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, dict):
            missing = {"type": "no_prompt", "message": "No prompt provided", "details": ""}
            return JSONResponse({"error": missing, "node_errors": {}}, status_code=400)
        info = nodes.object_info(
            self.checkpoints, self.model_folders_files(), self.folders.input_files()
        )
        checked = validate_prompt(prompt, info, files=self.folders.exists)
        if checked.error is not None:
            body = {"error": checked.error, "node_errors": checked.node_errors}
            return JSONResponse(body, status_code=400)
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        self._number += 1
        sid = str(body.get("client_id", ""))
        self._queue.append((self._number, prompt_id, prompt, sid, checked.outputs))
        self._wake.set()
        if self._worker is None:
            self._worker = asyncio.create_task(self._work())
        answer = {"prompt_id": prompt_id, "number": self._number}
        return JSONResponse({**answer, "node_errors": checked.node_errors})

    async def get_queue(self, request: Request) -> Response:
        pending = [[n, pid, p, {"client_id": c}, outs] for n, pid, p, c, outs in self._queue]
        running = [[0, self._running, {}, {}, []]] if self._running else []
        return JSONResponse({"queue_running": running, "queue_pending": pending})

    async def post_queue(self, request: Request) -> Response:
        body = await request.json()
        if body.get("clear"):
            self._queue.clear()
        doomed = set(body.get("delete", []))
        self._queue = [item for item in self._queue if item[1] not in doomed]
        return Response(status_code=200)

    async def interrupt(self, request: Request) -> Response:
        raw = await request.body()
        wanted = (await request.json()).get("prompt_id") if raw else None
        if self._running is not None and wanted in (None, self._running):
            self._interrupt.set()
        return Response(status_code=200)

    async def free(self, request: Request) -> Response:
        """``/free``: ``free_memory`` drops the output cache (and, in ComfyUI, unloads the
        models: the next prompt loads its checkpoint again)."""
        body = await request.json()
        if body.get("free_memory"):
            self.cache.clear()
        return Response(status_code=200)

    async def get_history(self, request: Request) -> Response:
        prompt_id = request.path_params["prompt_id"]
        entry = self.history.get(prompt_id)
        return JSONResponse({prompt_id: entry} if entry else {})

    async def view(self, request: Request) -> Response:
        """A file of the folder ``type`` names (default output), in ``subfolder``."""
        name = request.query_params.get("filename", "")
        folder = self.folders.by_type(request.query_params.get("type") or "output")
        if folder is None:
            return Response(status_code=400)
        path = (folder / request.query_params.get("subfolder", "") / name).resolve()
        if not name or folder not in path.parents or not path.is_file():
            return Response(status_code=404)
        return FileResponse(path)  # its type guessed from the name, as ComfyUI does

    async def upload_image(self, request: Request) -> Response:
        return await upload(request, self.folders)

    async def upload_mask(self, request: Request) -> Response:
        return await upload(request, self.folders, mask=True)

    async def object_info(self, request: Request) -> Response:
        return JSONResponse(
            nodes.object_info(
                self.checkpoints, self.model_folders_files(), self.folders.input_files()
            )
        )

    async def embeddings(self, request: Request) -> Response:
        # ComfyUI's /embeddings: the embeddings folder's names without their extension
        return JSONResponse(sorted(Path(n).stem for n in self.files["embeddings"]))

    # ---- websocket -----------------------------------------------------------

    async def websocket(self, ws: WebSocket) -> None:
        await ws.accept()
        sid = ws.query_params.get("clientId") or uuid.uuid4().hex
        self._sockets.setdefault(sid, set()).add(ws)
        try:
            status = {"status": {"exec_info": {"queue_remaining": len(self._queue)}}, "sid": sid}
            await ws.send_json({"type": "status", "data": status})
            while True:
                await ws.receive_text()
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            self._sockets.get(sid, set()).discard(ws)

    async def drop_websockets(self) -> None:
        """Close every socket at once (a network blip, a proxy restart)."""
        for sockets in list(self._sockets.values()):
            for ws in list(sockets):
                await ws.close(code=1012)

    async def _send(self, sid: str, message: dict[str, Any] | bytes) -> None:
        for ws in list(self._sockets.get(sid, ())):
            try:
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                else:
                    await ws.send_json(message)
            except (RuntimeError, OSError):
                self._sockets[sid].discard(ws)

    # ---- execution -----------------------------------------------------------

    async def _work(self) -> None:
        """Run queued prompts one at a time, forever."""
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            number, prompt_id, prompt, sid, wanted = self._queue.pop(0)
            self._running = prompt_id
            self._interrupt.clear()
            try:
                await self._execute(number, prompt_id, prompt, sid, wanted)
            finally:
                self._running = None

    async def _execute(
        self, number: int, prompt_id: str, prompt: dict[str, Any], sid: str, wanted: list[str]
    ) -> None:
        loop = asyncio.get_running_loop()
        messages: list[list[Any]] = []
        outbox: asyncio.Queue[dict[str, Any] | bytes | None] = asyncio.Queue()

        def emit(kind: str, data: dict[str, Any] | bytes) -> None:
            if isinstance(data, dict):
                data = {**data, "prompt_id": prompt_id} if kind != "status" else data
                message: dict[str, Any] | bytes = {"type": kind, "data": data}
                if kind.startswith("execution_"):
                    messages.append([kind, data])
            else:
                message = data
            loop.call_soon_threadsafe(outbox.put_nowait, message)

        sender = asyncio.create_task(self._drain(sid, outbox))
        stamp = int(time.time() * 1000)
        emit("execution_start", {"timestamp": stamp})
        signatures = self.cache.signatures(prompt, self._is_changed)
        self.cache.keep_only(signatures)
        cached = [n for n in prompt if self.cache.get(signatures[n]) is not None]
        emit("execution_cached", {"nodes": cached, "timestamp": stamp})
        outputs: dict[str, Any] = {}
        run = _Run(prompt, wanted, signatures, emit, outputs)
        status = await asyncio.to_thread(self._run_graph, run)
        self.history[prompt_id] = {
            "prompt": [number, prompt_id, prompt, {"client_id": sid}, wanted],
            "outputs": outputs,
            "status": {
                "status_str": status,
                "completed": status == "success",
                "messages": messages,
            },
            "meta": {
                k: {"node_id": k, "display_node": k, "parent_node": None, "real_node_id": k}
                for k in outputs
            },
        }
        emit("executing", {"node": None, "display_node": None})  # after history, as ComfyUI does
        loop.call_soon_threadsafe(outbox.put_nowait, None)
        await sender

    def _is_changed(self, node: dict[str, Any]) -> str | None:
        """ComfyUI's ``LoadImage.IS_CHANGED``: the file's sha256, part of the node's cache
        key, so a file overwritten under the same name is read again."""
        image = (node.get("inputs") or {}).get("image")
        if node.get("class_type") not in ("LoadImage", "LoadImageMask") or not isinstance(
            image, str
        ):
            return None
        try:
            return hashlib.sha256(self.folders.annotated(image).read_bytes()).hexdigest()
        except (OSError, ValueError):
            return None

    async def _drain(self, sid: str, outbox: asyncio.Queue[dict[str, Any] | bytes | None]) -> None:
        while (message := await outbox.get()) is not None:
            await self._send(sid, message)

    def _run_graph(self, run: _Run) -> str:
        """Execute the wanted output nodes and what they need (in a worker thread); a node
        whose signature is cached is not run (ComfyUI's ``execute``: a cached output node
        only sends ``executed`` with what it showed when it ran)."""
        prompt, emit, outputs = run.prompt, run.emit, run.outputs
        done: dict[str, tuple[Any, ...]] = {}
        executed: list[str] = []
        current = {"node": ""}

        def on_progress(value: int, total: int, preview: Image.Image) -> None:
            emit("progress", {"value": value, "max": total, "node": current["node"]})
            if self.preview_method != "none":
                emit("preview", _preview_frame(preview))

        ctx = nodes.Context(
            self.output_dir,
            self.checkpoints,
            on_progress,
            self._interrupt.is_set,
            self.step_delay_s,
            temp_dir=self.folders.temp,
            open_input=self.folders.annotated,
        )

        def execute(node_id: str) -> tuple[Any, ...]:
            if node_id in done:
                return done[node_id]
            node, signature = prompt[node_id], run.signatures[node_id]
            output_node = nodes.NODES[node["class_type"]].output_node
            hit = self.cache.get(signature)
            if hit is None:
                inputs = {
                    k: execute(str(v[0]))[int(v[1])] if isinstance(v, list) else v
                    for k, v in node.get("inputs", {}).items()
                }
                current["node"] = node_id
                emit("executing", {"node": node_id, "display_node": node_id})
                if node["class_type"] == "KSampler" and self.fail_next is not None:
                    message, self.fail_next = self.fail_next, None
                    raise RuntimeError(message)
                result = nodes.run_node(node["class_type"], inputs, ctx)
                hit = Entry(result, result[0] if output_node else None)
                self.cache.put(signature, hit)
                executed.append(node_id)
            done[node_id] = hit.outputs
            if output_node:
                outputs[node_id] = hit.ui
                emit("executed", {"node": node_id, "display_node": node_id, "output": hit.ui})
            return done[node_id]

        try:
            for node_id in run.wanted:
                execute(node_id)
        except nodes.Interrupted:
            emit(
                "execution_interrupted",
                {
                    "node_id": current["node"],
                    "node_type": prompt[current["node"]]["class_type"],
                    "executed": executed,
                    "timestamp": int(time.time() * 1000),
                },
            )
            return "error"
        except Exception as exc:
            emit(
                "execution_error",
                {
                    "node_id": current["node"],
                    "node_type": prompt[current["node"]]["class_type"],
                    "executed": executed,
                    "exception_message": str(exc),
                    "exception_type": type(exc).__name__,
                    "traceback": [],
                    "current_inputs": {},
                    "current_outputs": {},
                    "timestamp": int(time.time() * 1000),
                },
            )
            return "error"
        emit("execution_success", {"timestamp": int(time.time() * 1000)})
        return "success"


@dataclass
class _Run:
    """One prompt being executed: its graph, the outputs to run, each node's cache key,
    where messages go and the outputs it showed (its history's ``outputs``)."""

    prompt: dict[str, Any]
    wanted: list[str]
    signatures: dict[str, str]
    emit: Callable[[str, dict[str, Any] | bytes], None]
    outputs: dict[str, Any]


def _preview_frame(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=95)
    return struct.pack(">II", PREVIEW_IMAGE, JPEG) + buffer.getvalue()
