"""The nodes of the reference ComfyUI: a txt2img graph with a cheap image maker.

``CheckpointLoaderSimple -> CLIPTextEncode -> EmptyLatentImage -> KSampler ->
VAEDecode -> SaveImage`` (or VideoHelperSuite's ``VHS_VideoCombine``), with
ComfyUI's input names and output types. The
"latent" is a small RGB picture that KSampler moves from seeded noise toward a
colour hashed from the prompt, one step at a time, so images are deterministic
for a seed and every step is a real intermediate image for previews.
"""

from __future__ import annotations

import posixpath
import random
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from PIL import Image

SAMPLERS = ("euler", "euler_ancestral", "dpmpp_2m", "ddim")
SCHEDULERS = ("normal", "karras", "simple")


class Interrupted(Exception):
    """The user asked ComfyUI to stop (``/interrupt``)."""


MAX_RESOLUTION = 16384  # ComfyUI's nodes.MAX_RESOLUTION
ANY_SEED = 0xFFFFFFFFFFFFFFFF  # KSampler's seed range: any 64-bit number


@dataclass
class NodeSpec:
    """One node type: required inputs (name -> type or list of choices), outputs, and each
    input's options as ComfyUI's ``INPUT_TYPES`` gives them (``default``, ``min``, ``max``)."""

    inputs: dict[str, str | tuple[str, ...]]
    outputs: tuple[str, ...]
    output_node: bool = False
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _size(default: int) -> dict[str, Any]:
    return {"default": default, "min": 16, "max": MAX_RESOLUTION, "step": 8}


NODES: dict[str, NodeSpec] = {
    "CheckpointLoaderSimple": NodeSpec(
        {"ckpt_name": "folder:checkpoints"}, ("MODEL", "CLIP", "VAE")
    ),
    # ComfyUI's LoraLoader and VAELoader: their file inputs list the ``loras`` and ``vae``
    # folders (``folder_paths.get_filename_list``), so a file the backend lacks is refused
    # with ``value_not_in_list`` like a missing checkpoint
    "LoraLoader": NodeSpec(
        {
            "model": "MODEL",
            "clip": "CLIP",
            "lora_name": "folder:loras",
            "strength_model": "FLOAT",
            "strength_clip": "FLOAT",
        },
        ("MODEL", "CLIP"),
        options={
            "strength_model": {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01},
            "strength_clip": {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01},
        },
    ),
    "VAELoader": NodeSpec({"vae_name": "folder:vae"}, ("VAE",)),
    "CLIPTextEncode": NodeSpec(
        {"text": "STRING", "clip": "CLIP"},
        ("CONDITIONING",),
        options={"text": {"multiline": True, "dynamicPrompts": True}},
    ),
    "EmptyLatentImage": NodeSpec(
        {"width": "INT", "height": "INT", "batch_size": "INT"},
        ("LATENT",),
        options={
            "width": _size(512),
            "height": _size(512),
            "batch_size": {"default": 1, "min": 1, "max": 4096},
        },
    ),
    "KSampler": NodeSpec(
        {
            "model": "MODEL",
            "seed": "INT",
            "steps": "INT",
            "cfg": "FLOAT",
            "sampler_name": SAMPLERS,
            "scheduler": SCHEDULERS,
            "positive": "CONDITIONING",
            "negative": "CONDITIONING",
            "latent_image": "LATENT",
            "denoise": "FLOAT",
        },
        ("LATENT",),
        options={
            "seed": {"default": 0, "min": 0, "max": ANY_SEED},
            "steps": {"default": 20, "min": 1, "max": 10000},
            "cfg": {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01},
            "denoise": {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01},
        },
    ),
    "VAEDecode": NodeSpec({"samples": "LATENT", "vae": "VAE"}, ("IMAGE",)),
    "SaveImage": NodeSpec(
        {"images": "IMAGE", "filename_prefix": "STRING"},
        (),
        output_node=True,
        options={"filename_prefix": {"default": "ComfyUI"}},
    ),
    # ComfyUI's SaveLatent: its files are listed under ``latents``, in the ``latents``
    # subfolder its default prefix names.
    "SaveLatent": NodeSpec(
        {"samples": "LATENT", "filename_prefix": "STRING"},
        (),
        output_node=True,
        options={"filename_prefix": {"default": "latents/ComfyUI"}},
    ),
    # VideoHelperSuite's video output (a custom node most video workflows end in): its files
    # are listed under ``gifs`` in the history, not ``images``.
    "VHS_VideoCombine": NodeSpec(
        {
            "images": "IMAGE",
            "frame_rate": "FLOAT",
            "filename_prefix": "STRING",
            "format": ("image/gif", "image/webp"),
        },
        (),
        output_node=True,
        options={"frame_rate": {"default": 8, "min": 1, "step": 1}},
    ),
}


@dataclass
class Context:
    """What nodes may touch while a prompt runs."""

    output_dir: Path
    checkpoints: tuple[str, ...]
    on_progress: Callable[[int, int, Image.Image], None]  # (value, max, preview)
    interrupted: Callable[[], bool]
    step_delay_s: float = 0.0
    saved: list[dict[str, str]] = field(default_factory=list)


def run_node(class_type: str, inputs: dict[str, Any], ctx: Context) -> tuple[Any, ...]:
    """Execute one node on its resolved inputs; returns its outputs."""
    if class_type in ("CheckpointLoaderSimple", "LoraLoader", "VAELoader"):
        return _load(class_type, inputs)
    if class_type == "CLIPTextEncode":
        return (str(inputs["text"]),)
    if class_type == "EmptyLatentImage":
        return ({"width": int(inputs["width"]), "height": int(inputs["height"])},)
    if class_type == "KSampler":
        return (_sample(inputs, ctx),)
    if class_type == "VAEDecode":
        return (inputs["samples"],)
    if class_type == "SaveImage":
        return _save(inputs["images"], str(inputs.get("filename_prefix", "ComfyUI")), ctx)
    if class_type == "SaveLatent":
        return _save_latent(inputs["samples"], str(inputs["filename_prefix"]), ctx)
    if class_type == "VHS_VideoCombine":
        return _combine(inputs, ctx)
    raise KeyError(class_type)


def _load(class_type: str, inputs: dict[str, Any]) -> tuple[Any, ...]:
    """The loaders: what they load is only named (the reference has no weights)."""
    if class_type == "LoraLoader":
        lora = f"+lora:{inputs['lora_name']}"
        return (f"{inputs['model']}{lora}", f"{inputs['clip']}{lora}")
    if class_type == "VAELoader":
        return (f"vae:{inputs['vae_name']}",)
    name = inputs["ckpt_name"]
    return (f"model:{name}", f"clip:{name}", f"vae:{name}")


def _sample(inputs: dict[str, Any], ctx: Context) -> Image.Image:
    latent, steps = inputs["latent_image"], int(inputs["steps"])
    size = (max(8, latent["width"] // 8), max(8, latent["height"] // 8))
    rng = random.Random(int(inputs["seed"]))
    noise = Image.frombytes(
        "RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3))
    )
    colour = zlib.crc32(str(inputs["positive"]).encode()).to_bytes(4, "big")[:3]
    target = Image.new("RGB", size, tuple(colour))
    image = noise
    for step in range(1, steps + 1):
        if ctx.interrupted():
            raise Interrupted
        if ctx.step_delay_s:
            time.sleep(ctx.step_delay_s)
        image = Image.blend(noise, target, step / steps * float(inputs.get("denoise", 1.0)))
        ctx.on_progress(step, steps, image)
    return image.resize((latent["width"], latent["height"]), Image.Resampling.NEAREST)


def _save(image: Image.Image, prefix: str, ctx: Context) -> tuple[Any, ...]:
    path, entry = _save_path(prefix, "_.png", ctx)
    image.save(path)
    ctx.saved.append(entry)
    return ({"images": [entry]},)


def _save_latent(latent: Image.Image, prefix: str, ctx: Context) -> tuple[Any, ...]:
    """SaveLatent: listed under ``latents`` (the reference's latent is a picture, stored
    as PNG bytes in the ``.latent`` file; ComfyUI stores a safetensors tensor)."""
    path, entry = _save_path(prefix, "_.latent", ctx)
    latent.save(path, format="PNG")
    ctx.saved.append(entry)
    return ({"latents": [entry]},)


def _combine(inputs: dict[str, Any], ctx: Context) -> tuple[Any, ...]:
    """A short animation of the image, as VideoHelperSuite saves one."""
    image: Image.Image = inputs["images"]
    fmt = str(inputs.get("format", "image/gif"))
    prefix, ext = str(inputs.get("filename_prefix", "AnimateDiff")), fmt.split("/")[1]
    path, entry = _save_path(prefix, f".{ext}", ctx)
    first = image.convert("RGB")
    frames = [first, Image.eval(first, lambda v: 255 - v)]  # it, then its negative
    duration = round(1000 / max(0.1, float(inputs.get("frame_rate", 8.0))))
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=duration)
    entry["format"] = fmt
    ctx.saved.append(entry)
    return ({"gifs": [entry]},)


def _save_path(prefix: str, suffix: str, ctx: Context) -> tuple[Path, dict[str, str]]:
    """Where a node saves, as ComfyUI's ``folder_paths.get_save_image_path`` decides: a
    prefix ``a/b`` saves ``b_00001<suffix>`` in subfolder ``a``, the counter one past the
    highest already there (so a deleted file's number is not reused while later ones stay)."""
    relative = PurePosixPath(posixpath.normpath(prefix))
    subfolder, stem = str(relative.parent).strip("."), relative.name
    folder = (ctx.output_dir / subfolder).resolve()
    if ctx.output_dir.resolve() not in (folder, *folder.parents):
        raise ValueError("Saving image outside the output folder is not allowed.")
    folder.mkdir(parents=True, exist_ok=True)
    counters = [_counter(p.name, stem) for p in folder.glob(f"{stem}_*")]
    filename = f"{stem}_{max(counters, default=0) + 1:05d}{suffix}"
    return folder / filename, {"filename": filename, "subfolder": subfolder, "type": "output"}


def _counter(name: str, stem: str) -> int:
    digits = name[len(stem) + 1 :].split("_")[0].split(".")[0]
    return int(digits) if digits.isdigit() else 0


MODEL_FOLDERS = (
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "gligen",
    "upscale_models",
    "custom_nodes",
    "hypernetworks",
    "photomaker",
    "classifiers",
)
"""ComfyUI's model folders in the order ``folder_paths.folder_names_and_paths`` registers
them: what ``GET /models`` lists."""


def object_info(
    checkpoints: tuple[str, ...], folders: Mapping[str, Sequence[str]] | None = None
) -> dict[str, Any]:
    """``GET /object_info``: every node's inputs and outputs in ComfyUI's shape; a file
    input lists its folder's files (``checkpoints``: the checkpoints folder's)."""
    files = {**(folders or {}), "checkpoints": checkpoints}
    info = {}
    for name, spec in NODES.items():
        required: dict[str, Any] = {}
        for key, kind in spec.inputs.items():
            if isinstance(kind, str) and kind.startswith("folder:"):
                required[key] = [list(files.get(kind.removeprefix("folder:"), ()))]
            elif isinstance(kind, tuple):
                required[key] = [list(kind)]
            else:
                required[key] = [kind, spec.options[key]] if key in spec.options else [kind]
        info[name] = {  # every key ComfyUI's node_info gives (its web frontend reads them)
            "input": {"required": required},
            "input_order": {"required": list(required)},
            "output": list(spec.outputs),
            "output_is_list": [False] * len(spec.outputs),
            "output_name": list(spec.outputs),
            "name": name,
            "display_name": name,
            "description": "",
            "python_module": "nodes",
            "category": "corral-reference",
            "output_node": spec.output_node,
        }
    return info
