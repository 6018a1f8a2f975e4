"""The AUTOMATIC1111 executor: txt2img, img2img and upscale through ``/sdapi/v1``.

A job's payload is the webui's own request body plus ``"mode"``
(``txt2img`` by default, ``img2img``, or ``upscale`` for
``/extra-single-image``). Results are the images (``image-N.png``) and
``response.json``, the webui's answer without its images (``info``,
``parameters``), so a caller can rebuild the webui's own response. Mode
``catalog`` runs nothing: it answers ``catalog.json`` with the backend's
``sd-models``, ``samplers``, ``upscalers``, ``loras`` and ``options``.

While the request runs the executor polls ``/progress`` for step counts and
the live preview; a stop calls ``/interrupt``, after which the webui answers
the pending request with the partial image (kept on interrupt). The backend
runs one generation at a time, and its progress endpoint is global, so the
executor runs one job at a time.

A job's input files fill the request's images (``with_inputs``). When the job
names a model that is not loaded, the executor switches the checkpoint through
``/options`` first. A checkpoint, or a LoRA the prompt names (``<lora:name:weight>``),
that the webui does not have fails the job retryably, naming it
(``model_names.lacking``): another node may have it. When it names none, asks for a random
seed or names no sampler, the model, seed and sampler that were used are reported
in ``Finished.modified`` (the server keeps them as the job's ``ran``).

The webui's API has no mid-sampling checkpoint, so a job whose machine is lost
samples again from step 0 on the next one. So that the restart makes the same
image, a random seed (``seed: -1`` or none) is not left to the webui to draw:
the executor pins one derived from the job's id (``job_seed``), the same on
every attempt and every machine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from corral.agent.executors.base import (
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
    Result,
    StopSignal,
    Update,
    monotone,
    stopped_terminal,
)
from corral.agent.executors.http_common import backend_errors, check_response
from corral.agent.executors.model_files import file_stem, install
from corral.core import Clock, ExecutorError, InvalidSpec
from corral.core.model_names import a1111_models, lacking

MODES = {
    "txt2img": "/sdapi/v1/txt2img",
    "img2img": "/sdapi/v1/img2img",
    "upscale": "/sdapi/v1/extra-single-image",
}
LOAD_TIMEOUT_S = 600.0
"""Loading a large checkpoint from a slow disk takes minutes."""


class A1111Executor:
    """Drives one AUTOMATIC1111 webui at ``base_url`` (started with ``--api``)."""

    def __init__(
        self,
        base_url: str,
        clock: Clock,
        *,
        poll_interval_s: float = 0.5,
        request_timeout_s: float = 30.0,
        name: str = "a1111",
        models_dir: Path | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._models_dir = models_dir  # its models/Stable-diffusion: registered models go there
        self._loaded: str | None = None  # the checkpoint it last used (the webui keeps it loaded)
        self._clock = clock
        self._poll_s = poll_interval_s
        self._timeout = request_timeout_s
        self._name = name
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self._name

    def loaded(self) -> tuple[str, ...]:
        """The checkpoint the webui has in GPU memory, as far as this executor knows."""
        return (self._loaded,) if self._loaded else ()

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        if assignment.payload.get("mode") == "catalog":  # lists only: no need to wait for a turn
            with backend_errors(self._name, self._base_url):
                yield Finished((await catalog(self._base_url, self._timeout, self._name),))
            return
        payload = await asyncio.to_thread(with_inputs, assignment) if assignment.inputs else None
        mode, body = _request(payload or assignment.payload)
        async with self._lock:
            if stop.requested is not None:
                yield stopped_terminal(stop.requested)
                return
            with backend_errors(self._name, self._base_url):
                async with httpx.AsyncClient(
                    base_url=self._base_url, timeout=self._timeout
                ) as client:
                    async for update in self._generate(client, assignment, mode, body, stop):
                        yield update

    async def _generate(
        self,
        client: httpx.AsyncClient,
        assignment: JobWork,
        mode: str,
        body: dict[str, Any],
        stop: StopSignal,
    ) -> AsyncIterator[Update]:
        modified: dict[str, str] = {}
        await self._check_loras(client, body)
        if mode != "upscale":
            wanted = await self._provide(client, assignment)
            modified, switched = await self._ensure_model(client, wanted)
            self._loaded = assignment.model or modified.get("model", "").split(" [")[0] or None
            if switched:
                yield LogLine(switched, "agent")
            if body.get("seed", -1) in (-1, None):
                body["seed"] = job_seed(assignment.job_id)
                modified["seed"] = str(body["seed"])
            if assignment.attempt > 1:
                note = f"sampling again from step 0 with seed {body.get('seed')}: the webui "
                note += "cannot resume mid-sampling, the same seed makes the same image"
                yield LogLine(note, "agent")
        call = asyncio.create_task(client.post(MODES[mode], json=body, timeout=None))
        try:
            async for update in self._follow(client, call, stop):
                yield update
            response = await call
        finally:
            call.cancel()
        check_response(response, self._name, MODES[mode])
        images, info = _parse(response.json(), mode)
        if mode != "upscale":
            modified |= _filled_in(body, info)
        pictures = [Result(f"image-{i}.png", data, "image/png") for i, data in enumerate(images)]
        results = (*pictures, _rest(response.json()))
        if stop.requested is not None:
            yield stopped_terminal(stop.requested, results, modified)
            return
        yield Progress(1.0)
        yield Finished(results, modified)

    async def _provide(self, client: httpx.AsyncClient, assignment: JobWork) -> str | None:
        """The name to ask the webui for: a model from the agent's cache is linked into its
        checkpoint folder first, and the webui told to look again."""
        if assignment.model is None or assignment.model_path is None or not self._models_dir:
            return assignment.model
        install(self._models_dir, assignment.model, assignment.model_path)
        refreshed = await client.post("/sdapi/v1/refresh-checkpoints")
        check_response(refreshed, self._name, "/refresh-checkpoints")
        return file_stem(assignment.model)

    async def _check_loras(self, client: httpx.AsyncClient, body: Mapping[str, Any]) -> None:
        """Refuse a prompt naming LoRAs the webui lacks: it would run without them (its Lora
        extension only notes "not found" in the infotext), while another node may have them."""
        wanted = [m for m in a1111_models(body) if m.startswith("lora:")]
        if not wanted:
            return
        listed = check_response(await client.get("/sdapi/v1/loras"), self._name, "/loras")
        have = {f"lora:{e.get(k)}" for e in listed.json() for k in ("name", "alias")}
        missing = [m for m in wanted if m not in have]
        if missing:
            raise ExecutorError(lacking(self._name, missing), retryable=True)

    async def _ensure_model(
        self, client: httpx.AsyncClient, wanted: str | None
    ) -> tuple[dict[str, str], str]:
        """Load ``wanted`` unless it is loaded; returns (modified, what was done)."""
        options = check_response(await client.get("/sdapi/v1/options"), self._name, "/options")
        current = str(options.json().get("sd_model_checkpoint", ""))
        if wanted is None:
            return {"model": current}, ""
        models = check_response(await client.get("/sdapi/v1/sd-models"), self._name, "/sd-models")
        title = _match_model(wanted, models.json())
        if title is None:
            names = ", ".join(m.get("model_name", "?") for m in models.json())
            raise ExecutorError(  # another node may have it
                lacking(self._name, [wanted], f"it has: {names}"), retryable=True
            )
        if title == current:
            return {}, ""
        response = await client.post(
            "/sdapi/v1/options", json={"sd_model_checkpoint": title}, timeout=LOAD_TIMEOUT_S
        )
        check_response(response, self._name, "/options")
        return {}, f"switched checkpoint from {current} to {title}"

    async def _follow(
        self, client: httpx.AsyncClient, call: asyncio.Task[httpx.Response], stop: StopSignal
    ) -> AsyncIterator[Update]:
        """Progress and previews from ``/progress`` until ``call`` answers; interrupt on stop."""
        last, last_step, last_image, interrupted = 0.0, -1, "", False
        while not call.done():
            if stop.requested is not None and not interrupted:
                interrupted = True
                await client.post("/sdapi/v1/interrupt")
            poll = await client.get("/sdapi/v1/progress", params={"skip_current_image": "false"})
            if poll.status_code == 200:
                data = poll.json()
                state = data.get("state") or {}
                if state.get("job_count") and state.get("sampling_steps"):
                    fraction = float(data.get("progress") or 0.0)
                    step, total = int(state["sampling_step"]), int(state["sampling_steps"])
                    update = monotone(Progress(fraction, step, total), last)
                    if (update.fraction, step) != (last, last_step):
                        last, last_step = update.fraction, step
                        yield update
                image = data.get("current_image") or ""
                if image and image != last_image:
                    last_image = image
                    yield Preview(_b64(image), "image/png", int(state.get("sampling_step", 0)))
            waiters: set[asyncio.Future[Any]] = {
                call,
                asyncio.ensure_future(self._clock.sleep(self._poll_s)),
            }
            if stop.requested is None:
                waiters.add(asyncio.ensure_future(stop.wait()))
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for task in pending - {call}:
                task.cancel()


async def catalog(base_url: str, timeout: float, name: str) -> Result:
    """``catalog.json``: what the webui offers (a list it does not serve is empty)."""
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        for key in CATALOG:
            response = await client.get(f"/sdapi/v1/{key}")
            if response.status_code == 404 and key != "sd-models":
                out[key] = [] if key != "options" else {}
                continue
            out[key] = check_response(response, name, f"/{key}").json()
    return Result("catalog.json", json.dumps(out).encode(), "application/json")


CATALOG = ("sd-models", "samplers", "upscalers", "loras", "options")


def _rest(data: dict[str, Any]) -> Result:
    """The webui's answer without its images, as ``response.json``."""
    rest = {k: v for k, v in data.items() if k not in ("images", "image")}
    return Result("response.json", json.dumps(rest).encode(), "application/json")


def with_inputs(job: JobWork) -> Mapping[str, Any]:
    """The payload with the job's input files as the webui takes images (base64): a file
    named ``mask.*`` as ``mask``, the others in order as ``init_images`` (``image`` for an
    upscale). What the payload sets itself is kept."""
    files = [(f.name, f.path) for f in job.inputs if f.path is not None]
    if not files:
        return job.payload
    payload = dict(job.payload)
    images = []
    for name, path in files:
        encoded = base64.b64encode(path.read_bytes()).decode()
        if Path(name).stem.lower() == "mask":
            payload.setdefault("mask", encoded)
        else:
            images.append(encoded)
    if images and payload.get("mode") == "upscale":
        payload.setdefault("image", images[0])
    elif images:
        payload.setdefault("init_images", images)
    return payload


def job_seed(job_id: str) -> int:
    """The seed a job asking for a random one samples with: drawn from its id, so every
    attempt of it (on any machine) makes the same image; in the webui's 32-bit range."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big")


def _request(payload: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The mode and the webui request body; bad payloads name the field."""
    body = {k: v for k, v in payload.items() if k != "mode"}
    mode = payload.get("mode", "txt2img")
    if mode not in MODES:
        raise InvalidSpec("payload.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "img2img" and not body.get("init_images"):
        raise InvalidSpec("payload.init_images", "img2img needs at least one base64 image")
    if mode == "upscale" and not isinstance(body.get("image"), str):
        raise InvalidSpec("payload.image", "upscale needs a base64 image")
    return mode, body


def _match_model(wanted: str, models: list[dict[str, Any]]) -> str | None:
    """The checkpoint title the webui knows ``wanted`` by (title, name or file name)."""
    for model in models:
        title = str(model.get("title", ""))
        filename = str(model.get("filename", "")).rsplit("/", 1)[-1]
        names = {title, title.split(" [")[0], str(model.get("model_name", "")), filename}
        if wanted in names or f"{wanted}.safetensors" in names:
            return title
    return None


def _filled_in(body: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, str]:
    """What the webui chose where the request left it open, from its ``info``: the seed it
    drew for ``seed: -1`` and the sampler it used when none was named."""
    chosen = {}
    if body.get("seed", -1) == -1 and "seed" in info:
        chosen["seed"] = str(info["seed"])
    if not (body.get("sampler_name") or body.get("sampler_index")) and info.get("sampler_name"):
        chosen["sampler_name"] = str(info["sampler_name"])
    return chosen


def _parse(data: dict[str, Any], mode: str) -> tuple[list[bytes], dict[str, Any]]:
    """Images and the decoded ``info`` (a JSON string inside the JSON) of a response."""
    if mode == "upscale":
        return [_b64(data["image"])], {}
    info_text = data.get("info") or "{}"
    try:
        info = json.loads(info_text) if isinstance(info_text, str) else dict(info_text)
    except json.JSONDecodeError:
        info = {}
    return [_b64(image) for image in data.get("images", [])], info


def _b64(text: str) -> bytes:
    if text.startswith("data:"):
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode(text)
    except binascii.Error as exc:
        raise ExecutorError(
            f"backend sent an image that is not base64: {exc}", retryable=False
        ) from exc
