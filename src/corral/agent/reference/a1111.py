"""A reference AUTOMATIC1111 server: the ``/sdapi/v1`` API the agent uses, faithfully.

What it shares with the real one (stable-diffusion-webui ``modules/api``):

* one generation at a time (a queue lock: later requests wait their turn);
* ``txt2img``/``img2img`` answer ``{"images": [base64 PNG], "parameters": {...},
  "info": "<JSON in a string>"}``; ``seed: -1`` draws a seed, reported in ``info``;
* ``GET /progress`` answers ``progress`` (0.01 + done fraction, 0 when idle),
  ``eta_relative``, ``state`` {skipped, interrupted, stopping_generation, job,
  job_count, job_timestamp, job_no, sampling_step, sampling_steps},
  ``current_image`` (base64 PNG of the latents so far) and ``textinfo``;
* ``POST /interrupt`` stops sampling; the pending request then answers with the
  partial image;
* ``POST /options`` with ``sd_model_checkpoint`` loads that checkpoint (by
  title, name or file name), or fails with 500 ``model '...' not found``;
* ``POST /refresh-checkpoints`` finds new files in its checkpoint folder
  (``models_dir``), as the webui rescans ``models/Stable-diffusion``;
* ``/sd-models``, ``/loras`` (the built-in Lora extension's route), ``/sd-vae`` and
  ``/embeddings`` list what it has on disk in the webui's shapes;
* errors have its middleware's shape: ``{"error", "detail", "body", "errors"}``;
  a wrong sampler is a 400 ``Sampler not found``.

Images come from ``tiny_diffusion`` (a real diffusers pipeline with a tiny random
model on CPU). Faults for tests: ``step_delay_s`` (slow sampling), ``slow_calls_s`` (slow small
calls), ``fail_next`` (HTTP 500).

Over 400 lines on purpose: one class answering the webui routes the agent and the drop-in
API call, each as the webui answers it; the sampling itself lives in ``tiny_diffusion``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import random
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.agent.reference import tiny_diffusion

SAMPLERS = ("Euler a", "Euler", "DDIM", "DPM++ 2M")
UPSCALERS = ("None", "Lanczos", "Nearest")


@dataclass
class State:
    """``shared.state`` of the real server, as ``GET /progress`` shows it."""

    skipped: bool = False
    interrupted: bool = False
    stopping_generation: bool = False
    job: str = ""
    job_count: int = 0
    job_timestamp: str = "0"
    job_no: int = 0
    sampling_step: int = 0
    sampling_steps: int = 0


class ReferenceA1111:
    """The server's state and routes. ``app`` is the ASGI application."""

    def __init__(
        self,
        models: tuple[str, ...] = ("tiny-sd", "tiny-sd-v2"),
        *,
        step_delay_s: float = 0.0,
        loras: tuple[str, ...] = ("tiny-detail",),
        models_dir: Path | None = None,
        vaes: tuple[str, ...] = ("tiny-vae.safetensors",),
        embeddings: tuple[str, ...] = ("tiny-embed",),
    ) -> None:
        self.models = models
        self.models_dir = models_dir  # its models/Stable-diffusion (read on refresh-checkpoints)
        self.loras_on_disk = loras
        self.vaes_on_disk = vaes  # models/VAE (file names, as sd_vae.vae_dict keys them)
        self.embeddings_on_disk = embeddings  # embeddings/ (by name, the file's stem)
        self.loaded = models[0]
        self.step_delay_s = step_delay_s
        self.fail_next: str | None = None  # the next generation fails with this error (500)
        self.slow_calls_s = 0.0  # the small calls (options, models, progress) answer this late
        self.generations = 0
        self._queue_lock = asyncio.Lock()
        self._state_lock = threading.Lock()
        self._state = State()
        self._current_image: Image.Image | None = None
        self._started = 0.0
        self.app = Starlette(routes=self._routes(), exception_handlers={Exception: _error_500})

    def _routes(self) -> list[Route]:
        v1 = "/sdapi/v1"
        return [
            Route(f"{v1}/txt2img", self.txt2img, methods=["POST"]),
            Route(f"{v1}/img2img", self.img2img, methods=["POST"]),
            Route(f"{v1}/extra-single-image", self.extra_single_image, methods=["POST"]),
            Route(f"{v1}/progress", self.progress, methods=["GET"]),
            Route(f"{v1}/interrupt", self.interrupt, methods=["POST"]),
            Route(f"{v1}/options", self.get_options, methods=["GET"]),
            Route(f"{v1}/options", self.set_options, methods=["POST"]),
            Route(f"{v1}/sd-models", self.sd_models, methods=["GET"]),
            Route(f"{v1}/refresh-checkpoints", self.refresh_checkpoints, methods=["POST"]),
            Route(f"{v1}/samplers", self.samplers, methods=["GET"]),
            Route(f"{v1}/upscalers", self.upscalers, methods=["GET"]),
            Route(f"{v1}/loras", self.loras, methods=["GET"]),
            Route(f"{v1}/sd-vae", self.sd_vae, methods=["GET"]),
            Route(f"{v1}/embeddings", self.embeddings, methods=["GET"]),
        ]

    # ---- generation ----------------------------------------------------------

    async def txt2img(self, request: Request) -> Response:
        return await self._generate(await _json(request), img2img=False)

    async def img2img(self, request: Request) -> Response:
        body = await _json(request)
        if not body.get("init_images"):
            return error(404, "HTTPException", detail="Init image not found")
        return await self._generate(body, img2img=True)

    async def _generate(self, body: dict[str, Any], *, img2img: bool) -> Response:
        params, problem = _generation_params(body)
        if problem is not None:
            return problem
        if params["sampler_name"] not in SAMPLERS:
            return error(400, "HTTPException", detail="Sampler not found")
        init = _decode_image(body["init_images"][0]) if img2img else None
        async with self._queue_lock:
            if self.fail_next is not None:
                message, self.fail_next = self.fail_next, None
                return error(500, "OutOfMemoryError", errors=message)
            self._begin("scripts_img2img" if img2img else "scripts_txt2img", params["steps"])
            try:
                images = await asyncio.to_thread(self._run, params, init)
            finally:
                self._end()
            self.generations += 1
        info = self._info(params)
        return JSONResponse(
            {"images": [_encode(i) for i in images], "parameters": body, "info": json.dumps(info)}
        )

    def _run(self, params: dict[str, Any], init: Image.Image | None) -> list[Image.Image]:
        """Generate ``batch_size * n_iter`` images in a worker thread, updating the state."""
        images = []
        for job_no in range(params["n_iter"]):
            with self._state_lock:
                self._state.job_no = job_no
            for index in range(params["batch_size"]):
                seed = params["seed"] + job_no * params["batch_size"] + index
                images.append(self._one(params, seed, init))
                if self._state.interrupted:
                    return images
        return images

    def _one(self, params: dict[str, Any], seed: int, init: Image.Image | None) -> Image.Image:
        def on_step(step: int, total: int, preview: Image.Image) -> bool:
            with self._state_lock:
                self._state.sampling_step, self._state.sampling_steps = step, total
                self._current_image = preview
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            return self._state.interrupted

        job = tiny_diffusion.Generation(
            prompt=params["prompt"],
            negative_prompt=params["negative_prompt"],
            steps=params["steps"],
            width=params["width"],
            height=params["height"],
            seed=seed,
            cfg_scale=params["cfg_scale"],
            init_image=init,
            denoising_strength=params["denoising_strength"],
        )
        return tiny_diffusion.generate(self.models.index(self.loaded) + 1, job, on_step)

    def _info(self, params: dict[str, Any]) -> dict[str, Any]:
        seeds = [params["seed"] + i for i in range(params["batch_size"] * params["n_iter"])]
        return {
            "prompt": params["prompt"],
            "all_prompts": [params["prompt"]] * len(seeds),
            "negative_prompt": params["negative_prompt"],
            "seed": params["seed"],
            "all_seeds": seeds,
            "width": params["width"],
            "height": params["height"],
            "sampler_name": params["sampler_name"],
            "cfg_scale": params["cfg_scale"],
            "steps": params["steps"],
            "batch_size": params["batch_size"],
            "sd_model_name": self.loaded,
            "sd_model_hash": _hash(self.loaded)[:10],
            "job_timestamp": self._state.job_timestamp,
        }

    def _begin(self, job: str, steps: int) -> None:
        with self._state_lock:
            stamp = time.strftime("%Y%m%d%H%M%S")
            self._state = State(job=job, job_count=1, job_timestamp=stamp, sampling_steps=steps)
            self._current_image = None
            self._started = time.time()

    def _end(self) -> None:
        with self._state_lock:
            self._state.job = ""
            self._state.job_count = 0
            self._current_image = None

    async def extra_single_image(self, request: Request) -> Response:
        body = await _json(request)
        if "image" not in body:
            return validation_error("image", "Field required")
        upscaler = body.get("upscaler_1", "None")
        if upscaler not in UPSCALERS:
            return error(500, "ValueError", errors=f"could not find upscaler named {upscaler}")
        image = _decode_image(body["image"])
        factor = float(body.get("upscaling_resize", 2))
        async with self._queue_lock:
            size = (round(image.width * factor), round(image.height * factor))
            method = Image.Resampling.NEAREST if upscaler == "Nearest" else Image.Resampling.LANCZOS
            result = image.resize(size, method) if upscaler != "None" else image
        return JSONResponse(
            {"html_info": f"<p>Upscale: {factor}, {upscaler}</p>", "image": _encode(result)}
        )

    # ---- progress and control ---------------------------------------------

    async def progress(self, request: Request) -> Response:
        await asyncio.sleep(self.slow_calls_s)
        skip_image = request.query_params.get("skip_current_image", "false").lower() == "true"
        with self._state_lock:
            state, image = State(**asdict(self._state)), self._current_image
        if state.job_count == 0:
            body = {"progress": 0, "eta_relative": 0, "state": asdict(state), "textinfo": None}
            return JSONResponse({**body, "current_image": None, "current_task": None})
        progress = 0.01 + state.job_no / state.job_count
        if state.sampling_steps:
            progress += state.sampling_step / state.sampling_steps / state.job_count
        elapsed = time.time() - self._started
        return JSONResponse(
            {
                "progress": min(progress, 1.0),
                "eta_relative": elapsed / progress - elapsed,
                "state": asdict(state),
                "current_image": None if skip_image or image is None else _encode(image),
                "textinfo": None,
                "current_task": None,
            }
        )

    async def interrupt(self, request: Request) -> Response:
        with self._state_lock:
            if self._state.job_count:
                self._state.interrupted = True
        return JSONResponse({})

    async def get_options(self, request: Request) -> Response:
        await asyncio.sleep(self.slow_calls_s)
        return JSONResponse(
            {
                "sd_model_checkpoint": _title(self.loaded),
                "samples_format": "png",
                "CLIP_stop_at_last_layers": 1,
            }
        )

    async def set_options(self, request: Request) -> Response:
        body = await _json(request)
        wanted = body.get("sd_model_checkpoint")
        if wanted is not None:
            name = next((m for m in self.models if wanted in _aliases(m)), None)
            if name is None:
                return error(500, "RuntimeError", errors=f"model {wanted!r} not found")
            async with self._queue_lock:  # loading waits for the running generation
                self.loaded = name
        return JSONResponse(None)

    async def refresh_checkpoints(self, request: Request) -> Response:
        """Look in ``models_dir`` again: new ``*.safetensors`` files become models (by stem)."""
        if self.models_dir is not None:
            found = sorted(p.stem for p in self.models_dir.glob("*.safetensors"))
            self.models = (*self.models, *(m for m in found if m not in self.models))
        return JSONResponse(None)

    async def sd_models(self, request: Request) -> Response:
        await asyncio.sleep(self.slow_calls_s)
        return JSONResponse(
            [
                {
                    "title": _title(m),
                    "model_name": m,
                    "hash": _hash(m)[:10],
                    "sha256": _hash(m),
                    "filename": f"/models/Stable-diffusion/{m}.safetensors",
                    "config": None,
                }
                for m in self.models
            ]
        )

    async def samplers(self, request: Request) -> Response:
        return JSONResponse([{"name": s, "aliases": [], "options": {}} for s in SAMPLERS])

    async def loras(self, request: Request) -> Response:
        """The built-in Lora extension's list (the reference lists them; it cannot apply them)."""
        return JSONResponse(
            [
                {
                    "name": name,
                    "alias": name,
                    "path": f"/models/Lora/{name}.safetensors",
                    "metadata": {},
                }
                for name in self.loras_on_disk
            ]
        )

    async def sd_vae(self, request: Request) -> Response:
        """The webui's ``get_sd_vaes``: ``model_name`` (the file name) and ``filename``."""
        return JSONResponse(
            [{"model_name": v, "filename": f"/models/VAE/{v}"} for v in self.vaes_on_disk]
        )

    async def embeddings(self, request: Request) -> Response:
        """The webui's ``get_embeddings``: ``loaded`` (those that fit the loaded checkpoint)
        and ``skipped`` (the others), each by name; the reference skips none."""
        loaded = {
            name: {
                "step": None,
                "sd_checkpoint": None,
                "sd_checkpoint_name": None,
                "shape": 768,
                "vectors": 1,
            }
            for name in self.embeddings_on_disk
        }
        return JSONResponse({"loaded": loaded, "skipped": {}})

    async def upscalers(self, request: Request) -> Response:
        return JSONResponse(
            [
                {"name": u, "model_name": None, "model_path": None, "model_url": None, "scale": 4}
                for u in UPSCALERS
            ]
        )


_DEFAULTS: dict[str, Any] = {
    "prompt": "",
    "negative_prompt": "",
    "steps": 20,
    "width": 512,
    "height": 512,
    "seed": -1,
    "cfg_scale": 7.0,
    "sampler_name": "Euler a",
    "batch_size": 1,
    "n_iter": 1,
    "denoising_strength": 0.75,
}


def _generation_params(body: dict[str, Any]) -> tuple[dict[str, Any], Response | None]:
    """Defaults filled in and types checked, FastAPI style (422 naming the field)."""
    params = {**_DEFAULTS, **{k: v for k, v in body.items() if k in _DEFAULTS}}
    for key, default in _DEFAULTS.items():
        value = params[key]
        want = (int, float) if isinstance(default, float) else type(default)
        if isinstance(value, bool) or not isinstance(value, want):
            return params, validation_error(
                key, f"Input should be a valid {type(default).__name__}"
            )
    for key in ("steps", "width", "height", "batch_size", "n_iter"):
        if params[key] < 1:
            return params, validation_error(key, "Input should be greater than 0")
    if params["width"] % 8 or params["height"] % 8:
        return params, error(
            500, "ValueError", errors="`height` and `width` have to be divisible by 8"
        )
    if params["seed"] == -1:
        params["seed"] = random.randrange(2**32)
    return params, None


def _title(model: str) -> str:
    return f"{model}.safetensors [{_hash(model)[:10]}]"


def _aliases(model: str) -> set[str]:
    return {model, _title(model), f"{model}.safetensors"}


def _hash(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()


def _encode(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _decode_image(data: str) -> Image.Image:
    if data.startswith("data:"):
        data = data.split(",", 1)[1]
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


async def _json(request: Request) -> dict[str, Any]:
    body = await request.json()
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    return body


def error(status: int, name: str, *, detail: str = "", errors: str = "") -> JSONResponse:
    """An error in the shape of the webui's API exception middleware."""
    return JSONResponse(
        {"error": name, "detail": detail, "body": "", "errors": errors}, status_code=status
    )


def validation_error(field: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"detail": [{"type": "value_error", "loc": ["body", field], "msg": message}]},
        status_code=422,
    )


async def _error_500(request: Request, exc: Exception) -> Response:
    return error(500, type(exc).__name__, errors=str(exc))
