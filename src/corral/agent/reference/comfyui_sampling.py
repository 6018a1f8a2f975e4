"""The reference ComfyUI's samplers, split the way ComfyUI splits sampling.

The toy model "predicts" a colour hashed from the prompt; a sampler walks the
latent (an RGB picture) from seeded noise to that colour along ComfyUI's
schedule of noise levels, one Euler step per level. What mirrors ComfyUI
(``nodes.py``: ``common_ksampler``, ``KSamplerAdvanced``; ``comfy/samplers.py``:
``KSampler.sample``):

* the levels of ``steps`` steps are computed once for the whole run; ``end_at_step``
  keeps those up to it, then ``start_at_step`` drops those before it, and a start
  at or past the end returns the input latent untouched;
* ``return_with_leftover_noise: disable`` (ComfyUI's ``force_full_denoise``) sets
  the last kept level to 0, so a segment that ends early is fully denoised there;
  ``enable`` leaves it at its noise level, for the next segment to continue;
* ``add_noise: enable`` mixes the seeded noise into the input latent at the first
  level (``latent + noise * sigma``); ``disable`` starts from the latent as it is;
* ``KSampler`` is the whole run with noise and a full denoise; its ``denoise``
  below 1 runs the last ``steps`` levels of ``steps / denoise``.

Each step depends only on the latent and the level, as Euler and DDIM do, so a
run split in segments (leftover noise kept, no noise added after the first) is
the unsplit run bit for bit: every step computes the same numbers on the same
8-bit picture, and a saved latent (a PNG) is lossless. The reference ignores
``sampler_name``: it has one sampler.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

OnStep = Callable[[int, int, Image.Image], None]
"""(value, max, preview): ComfyUI's progress of one sampling call."""

INPUT_LATENTS = "INPUT_LATENTS"  # LoadLatent's choices: the input folder's .latent files
SAMPLERS = ("euler", "euler_ancestral", "dpmpp_2m", "ddim")
SCHEDULERS = ("normal", "karras", "simple")
ANY_SEED = 0xFFFFFFFFFFFFFFFF  # KSampler's seed range: any 64-bit number
_COMMON: dict[str, str | tuple[str, ...]] = {
    "model": "MODEL",
    "steps": "INT",
    "cfg": "FLOAT",
    "sampler_name": SAMPLERS,
    "scheduler": SCHEDULERS,
    "positive": "CONDITIONING",
    "negative": "CONDITIONING",
    "latent_image": "LATENT",
}
_OPTIONS: dict[str, dict[str, Any]] = {
    "steps": {"default": 20, "min": 1, "max": 10000},
    "cfg": {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01},
}
SPECS: dict[str, tuple[dict[str, str | tuple[str, ...]], tuple[str, ...], dict[str, Any]]] = {
    "KSamplerAdvanced": (
        {
            "model": "MODEL",
            "add_noise": ("enable", "disable"),
            "noise_seed": "INT",
            **{k: v for k, v in _COMMON.items() if k != "model"},
            "start_at_step": "INT",
            "end_at_step": "INT",
            "return_with_leftover_noise": ("disable", "enable"),
        },
        ("LATENT",),
        {
            **_OPTIONS,
            "noise_seed": {"default": 0, "min": 0, "max": ANY_SEED},
            "start_at_step": {"default": 0, "min": 0, "max": 10000},
            "end_at_step": {"default": 10000, "min": 0, "max": 10000},
        },
    ),
    "LoadLatent": ({"latent": INPUT_LATENTS}, ("LATENT",), {}),
}


def ksampler(inputs: dict[str, Any], on_step: OnStep) -> Image.Image:
    """``KSampler``: noise added, every level, fully denoised."""
    steps, denoise = int(inputs["steps"]), float(inputs.get("denoise", 1.0))
    levels = _levels(steps if denoise >= 0.9999 else int(steps / denoise))[-(steps + 1) :]
    return _sample(inputs, int(inputs["seed"]), levels, add_noise=True, on_step=on_step)


def ksampler_advanced(inputs: dict[str, Any], on_step: OnStep) -> Image.Image:
    """``KSamplerAdvanced``: one segment of a run (see the module doc)."""
    levels = _levels(int(inputs["steps"]))
    start, end = int(inputs["start_at_step"]), int(inputs["end_at_step"])
    if end < len(levels) - 1:
        levels = levels[: end + 1]
        if inputs["return_with_leftover_noise"] != "enable":
            levels[-1] = 0.0
    if start >= len(levels) - 1:
        return latent_picture(inputs["latent_image"])
    noise = inputs["add_noise"] == "enable"
    return _sample(inputs, int(inputs["noise_seed"]), levels[start:], noise, on_step)


def _levels(steps: int) -> list[float]:
    return [1.0 - k / steps for k in range(steps + 1)]


def _sample(
    inputs: dict[str, Any], seed: int, levels: list[float], add_noise: bool, on_step: OnStep
) -> Image.Image:
    latent = latent_picture(inputs["latent_image"])
    size = latent.size
    small = (max(8, size[0] // 8), max(8, size[1] // 8))
    colour = zlib.crc32(str(inputs["positive"]).encode()).to_bytes(4, "big")[:3]
    target = Image.new("RGB", size, tuple(colour))
    x = latent
    if add_noise:
        rng = random.Random(seed)
        pixels = bytes(rng.randrange(256) for _ in range(small[0] * small[1] * 3))
        noise = Image.frombytes("RGB", small, pixels).resize(size, Image.Resampling.NEAREST)
        x = Image.blend(latent, noise, levels[0])
    total = len(levels) - 1
    for i in range(total):
        # one Euler step toward the prediction, from this level to the next
        x = Image.blend(x, target, 1.0 - levels[i + 1] / levels[i] if levels[i] else 1.0)
        on_step(i + 1, total, x.resize(small, Image.Resampling.NEAREST))
    return x


def latent_picture(latent: Any) -> Image.Image:
    """The picture a latent is: an empty latent (``EmptyLatentImage``'s size) is black."""
    if isinstance(latent, Image.Image):
        return latent
    return Image.new("RGB", (int(latent["width"]), int(latent["height"])))


def decoded(latent: Any) -> Image.Image:
    """``VAEDecode``: the toy VAE decodes a latent to the picture it is."""
    return latent_picture(latent)


def save_latent(latent: Image.Image, path: Path) -> None:
    """The reference's ``.latent`` file: the picture as PNG (ComfyUI writes a safetensors
    tensor); lossless, so a loaded latent continues exactly where it was saved."""
    latent_picture(latent).save(path, format="PNG")


def load_latent(path: Path) -> Image.Image:
    """``LoadLatent``: the picture ``save_latent`` wrote."""
    with Image.open(path) as image:
        return image.convert("RGB")
