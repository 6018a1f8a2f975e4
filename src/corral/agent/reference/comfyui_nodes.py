"""The nodes of the reference ComfyUI: a txt2img graph with a cheap image maker, and
ComfyUI's model-free image nodes (``comfyui_images.py``).

``CheckpointLoaderSimple -> CLIPTextEncode -> EmptyLatentImage -> KSampler ->
VAEDecode -> SaveImage`` (or VideoHelperSuite's ``VHS_VideoCombine``), with
ComfyUI's input names and output types. The "latent" is an RGB picture that the
samplers move from seeded noise toward a colour hashed from the prompt, one step
at a time, so images are deterministic for a seed and every step is a real
intermediate image for previews. ``KSamplerAdvanced``, ``SaveLatent`` and
``LoadLatent`` split sampling as ComfyUI does (``comfyui_sampling.py``).
"""

from __future__ import annotations

import posixpath
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from PIL import Image

from corral.agent.reference import comfyui_images as images
from corral.agent.reference import comfyui_sampling as sampling
from corral.agent.reference.comfyui_images import MAX_RESOLUTION
from corral.agent.reference.comfyui_sampling import ANY_SEED, SAMPLERS, SCHEDULERS


class Interrupted(Exception):
    """The user asked ComfyUI to stop (``/interrupt``)."""


@dataclass
class NodeSpec:
    """One node type: required inputs (name -> type or list of choices), outputs, and each
    input's options as ComfyUI's ``INPUT_TYPES`` gives them (``default``, ``min``, ``max``)."""

    inputs: dict[str, str | tuple[str, ...]]
    outputs: tuple[str, ...]
    output_node: bool = False
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    category: str = "corral-reference"
    hidden: dict[str, str] = field(default_factory=dict)


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
    **{name: NodeSpec(i, o, options=opts) for name, (i, o, opts) in sampling.SPECS.items()},
    "VAEDecode": NodeSpec({"samples": "LATENT", "vae": "VAE"}, ("IMAGE",)),
    "SaveImage": NodeSpec(
        {"images": "IMAGE", "filename_prefix": "STRING"},
        (),
        output_node=True,
        options={"filename_prefix": {"default": "ComfyUI"}},
        category="image",
        hidden={"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
    ),
    # ComfyUI's PreviewImage (a SaveImage into the temp folder, listed with type "temp").
    "PreviewImage": NodeSpec(
        {"images": "IMAGE"},
        (),
        output_node=True,
        category="image",
        hidden={"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
    ),
    **{
        name: NodeSpec(inputs, outputs, options=options, category=category)
        for name, (inputs, options, outputs, category) in images.SPECS.items()
    },
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
    temp_dir: Path | None = None  # PreviewImage saves here (listed as type "temp")
    open_input: Callable[[str], Path] = Path  # an image name as LoadImage resolves it


def run_node(class_type: str, inputs: dict[str, Any], ctx: Context) -> tuple[Any, ...]:
    """Execute one node on its resolved inputs; returns its outputs."""
    if class_type in images.SPECS:
        return images.run_image_node(class_type, inputs, ctx.open_input)
    return _RUNNERS[class_type](inputs, ctx)


_RUNNERS: dict[str, Callable[[dict[str, Any], Context], tuple[Any, ...]]] = {
    "CheckpointLoaderSimple": lambda i, ctx: _load("CheckpointLoaderSimple", i),
    "LoraLoader": lambda i, ctx: _load("LoraLoader", i),
    "VAELoader": lambda i, ctx: _load("VAELoader", i),
    "CLIPTextEncode": lambda i, ctx: (str(i["text"]),),
    "EmptyLatentImage": lambda i, ctx: ({"width": int(i["width"]), "height": int(i["height"])},),
    "KSampler": lambda i, ctx: (sampling.ksampler(i, _stepper(ctx)),),
    "KSamplerAdvanced": lambda i, ctx: (sampling.ksampler_advanced(i, _stepper(ctx)),),
    "LoadLatent": lambda i, ctx: (sampling.load_latent(ctx.open_input(str(i["latent"]))),),
    "VAEDecode": lambda i, ctx: (sampling.decoded(i["samples"]),),
    "SaveImage": lambda i, ctx: _save(i["images"], str(i.get("filename_prefix", "ComfyUI")), ctx),
    "PreviewImage": lambda i, ctx: _preview(i["images"], ctx),
    "SaveLatent": lambda i, ctx: _save_latent(i["samples"], str(i["filename_prefix"]), ctx),
    "VHS_VideoCombine": lambda i, ctx: _combine(i, ctx),
}


def _load(class_type: str, inputs: dict[str, Any]) -> tuple[Any, ...]:
    """The loaders: what they load is only named (the reference has no weights)."""
    if class_type == "LoraLoader":
        lora = f"+lora:{inputs['lora_name']}"
        return (f"{inputs['model']}{lora}", f"{inputs['clip']}{lora}")
    if class_type == "VAELoader":
        return (f"vae:{inputs['vae_name']}",)
    name = inputs["ckpt_name"]
    return (f"model:{name}", f"clip:{name}", f"vae:{name}")


def _stepper(ctx: Context) -> sampling.OnStep:
    """What a sampler calls before each step: stop on an interrupt, pace, report."""

    def step(value: int, total: int, latent: Image.Image) -> None:
        if ctx.interrupted():
            raise Interrupted
        if ctx.step_delay_s:
            time.sleep(ctx.step_delay_s)
        ctx.on_progress(value, total, latent)

    return step


def _save(image: Any, prefix: str, ctx: Context, kind: str = "output") -> tuple[Any, ...]:
    """SaveImage: each picture of the batch as ``<prefix>_<counter>_.png``."""
    entries = []
    for picture in images.batch(image):
        path, entry = _save_path(prefix, "_.png", ctx, kind)
        picture.save(path)
        ctx.saved.append(entry)
        entries.append(entry)
    return ({"images": entries},)


def _preview(image: Any, ctx: Context) -> tuple[Any, ...]:
    """PreviewImage: saved as SaveImage saves, in the temp folder, its prefix
    ``ComfyUI_temp_`` and five random letters (ComfyUI's ``prefix_append``)."""
    letters = "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    return _save(image, f"ComfyUI_temp_{letters}", ctx, "temp")


def _save_latent(latent: Image.Image, prefix: str, ctx: Context) -> tuple[Any, ...]:
    """SaveLatent: listed under ``latents`` (the reference's latent is a picture, stored
    as PNG bytes in the ``.latent`` file; ComfyUI stores a safetensors tensor)."""
    path, entry = _save_path(prefix, "_.latent", ctx)
    sampling.save_latent(latent, path)
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


def _save_path(
    prefix: str, suffix: str, ctx: Context, kind: str = "output"
) -> tuple[Path, dict[str, str]]:
    """Where a node saves, as ComfyUI's ``folder_paths.get_save_image_path`` decides: a
    prefix ``a/b`` saves ``b_00001<suffix>`` in subfolder ``a``, the counter one past the
    highest already there (so a deleted file's number is not reused while later ones stay)."""
    relative = PurePosixPath(posixpath.normpath(prefix))
    subfolder, stem = str(relative.parent).strip("."), relative.name
    root = ctx.temp_dir if kind == "temp" and ctx.temp_dir is not None else ctx.output_dir
    folder = (root / subfolder).resolve()
    if root.resolve() not in (folder, *folder.parents):
        raise ValueError("Saving image outside the output folder is not allowed.")
    folder.mkdir(parents=True, exist_ok=True)
    counters = [_counter(p.name, stem) for p in folder.glob(f"{stem}_*")]
    filename = f"{stem}_{max(counters, default=0) + 1:05d}{suffix}"
    return folder / filename, {"filename": filename, "subfolder": subfolder, "type": kind}


def _counter(name: str, stem: str) -> int:
    digits = name[len(stem) + 1 :].split("_")[0].split(".")[0]
    return int(digits) if digits.isdigit() else 0


def object_info(
    checkpoints: tuple[str, ...],
    folders: Mapping[str, Sequence[str]] | None = None,
    files: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``GET /object_info``: every node as ComfyUI's ``server.node_info`` describes it
    (``input`` with ``required`` and ``hidden``, ``input_order``, ``output``,
    ``output_is_list``, ``output_name``, names, category, ``output_node``); a model file
    input lists its folder's files (``folders``; ``checkpoints``: the checkpoints
    folder's), and ``files`` are the input folder's files, ``LoadImage``'s choices."""
    models = {**(folders or {}), "checkpoints": checkpoints}
    info = {}
    for name, spec in NODES.items():
        required: dict[str, Any] = {}
        for key, kind in spec.inputs.items():
            if isinstance(kind, str) and kind.startswith("folder:"):
                choices: Any = [list(models.get(kind.removeprefix("folder:"), ()))]
            elif kind == images.INPUT_FILES:
                choices = [sorted(files)]
            elif kind == sampling.INPUT_LATENTS:  # LoadLatent lists the input folder's latents
                choices = [sorted(f for f in files if f.endswith(".latent"))]
            elif isinstance(kind, tuple):
                choices = [list(kind)]
            else:
                choices = [kind]
            required[key] = [*choices, spec.options[key]] if key in spec.options else choices
        inputs: dict[str, Any] = {"required": required}
        if spec.hidden:
            inputs["hidden"] = dict(spec.hidden)
        info[name] = {
            "input": inputs,
            "input_order": {k: list(v) for k, v in inputs.items()},
            "output": list(spec.outputs),
            "output_is_list": [False] * len(spec.outputs),
            "output_name": list(spec.outputs),
            "name": name,
            "display_name": images.DISPLAY.get(name, name),
            "description": "",
            "python_module": "nodes",
            "category": spec.category,
            "output_node": spec.output_node,
        }
    return info
