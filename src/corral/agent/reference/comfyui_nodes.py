"""The nodes of the reference ComfyUI: a txt2img graph with a cheap image maker.

``CheckpointLoaderSimple -> CLIPTextEncode -> EmptyLatentImage -> KSampler ->
VAEDecode -> SaveImage`` (or VideoHelperSuite's ``VHS_VideoCombine``), with
ComfyUI's input names and output types. The
"latent" is a small RGB picture that KSampler moves from seeded noise toward a
colour hashed from the prompt, one step at a time, so images are deterministic
for a seed and every step is a real intermediate image for previews.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

SAMPLERS = ("euler", "euler_ancestral", "dpmpp_2m", "ddim")
SCHEDULERS = ("normal", "karras", "simple")


class Interrupted(Exception):
    """The user asked ComfyUI to stop (``/interrupt``)."""


@dataclass
class NodeSpec:
    """One node type: required inputs (name -> type or list of choices), outputs."""

    inputs: dict[str, str | tuple[str, ...]]
    outputs: tuple[str, ...]
    output_node: bool = False


NODES: dict[str, NodeSpec] = {
    "CheckpointLoaderSimple": NodeSpec({"ckpt_name": "CKPT"}, ("MODEL", "CLIP", "VAE")),
    "CLIPTextEncode": NodeSpec({"text": "STRING", "clip": "CLIP"}, ("CONDITIONING",)),
    "EmptyLatentImage": NodeSpec(
        {"width": "INT", "height": "INT", "batch_size": "INT"}, ("LATENT",)
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
    ),
    "VAEDecode": NodeSpec({"samples": "LATENT", "vae": "VAE"}, ("IMAGE",)),
    "SaveImage": NodeSpec({"images": "IMAGE", "filename_prefix": "STRING"}, (), output_node=True),
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
    if class_type == "CheckpointLoaderSimple":
        name = inputs["ckpt_name"]
        return (f"model:{name}", f"clip:{name}", f"vae:{name}")
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
    if class_type == "VHS_VideoCombine":
        return _combine(inputs, ctx)
    raise KeyError(class_type)


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
    index = len(list(ctx.output_dir.glob(f"{prefix}_*.png"))) + 1
    filename = f"{prefix}_{index:05d}_.png"
    image.save(ctx.output_dir / filename)
    entry = {"filename": filename, "subfolder": "", "type": "output"}
    ctx.saved.append(entry)
    return ({"images": [entry]},)


def _combine(inputs: dict[str, Any], ctx: Context) -> tuple[Any, ...]:
    """A short animation of the image, as VideoHelperSuite saves one."""
    image: Image.Image = inputs["images"]
    fmt = str(inputs.get("format", "image/gif"))
    prefix, ext = str(inputs.get("filename_prefix", "AnimateDiff")), fmt.split("/")[1]
    index = len(list(ctx.output_dir.glob(f"{prefix}_*.{ext}"))) + 1
    filename = f"{prefix}_{index:05d}.{ext}"
    first = image.convert("RGB")
    frames = [first, Image.eval(first, lambda v: 255 - v)]  # it, then its negative
    duration = round(1000 / max(0.1, float(inputs.get("frame_rate", 8.0))))
    frames[0].save(
        ctx.output_dir / filename, save_all=True, append_images=frames[1:], duration=duration
    )
    entry = {"filename": filename, "subfolder": "", "type": "output", "format": fmt}
    ctx.saved.append(entry)
    return ({"gifs": [entry]},)


def object_info(checkpoints: tuple[str, ...]) -> dict[str, Any]:
    """``GET /object_info``: every node's inputs and outputs in ComfyUI's shape."""
    info = {}
    for name, spec in NODES.items():
        required: dict[str, Any] = {}
        for key, kind in spec.inputs.items():
            if kind == "CKPT":
                required[key] = [list(checkpoints)]
            elif isinstance(kind, tuple):
                required[key] = [list(kind)]
            else:
                required[key] = [kind]
        info[name] = {
            "input": {"required": required},
            "output": list(spec.outputs),
            "output_name": list(spec.outputs),
            "name": name,
            "display_name": name,
            "category": "corral-reference",
            "output_node": spec.output_node,
        }
    return info


def validate(
    prompt: dict[str, Any], checkpoints: tuple[str, ...]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """ComfyUI's prompt validation: (error, node_errors); error None when valid."""
    for node_id, node in prompt.items():
        if not isinstance(node, dict) or node.get("class_type") not in NODES:
            kind = node.get("class_type") if isinstance(node, dict) else None
            return _error(
                "invalid_prompt",
                f"Cannot execute because node {kind} does not exist.",
                f"Node ID '#{node_id}'",
            ), {}
    if not any(NODES[n["class_type"]].output_node for n in prompt.values()):
        return _error("prompt_no_outputs", "Prompt has no outputs"), {}
    node_errors = {}
    for node_id, node in prompt.items():
        errors = _node_errors(node, prompt, checkpoints)
        if errors:
            node_errors[node_id] = {
                "errors": errors,
                "dependent_outputs": [],
                "class_type": node["class_type"],
            }
    if node_errors:
        return _error(
            "prompt_outputs_failed_validation", "Prompt outputs failed validation"
        ), node_errors
    return None, {}


def _node_errors(
    node: dict[str, Any], prompt: dict[str, Any], checkpoints: tuple[str, ...]
) -> list[dict[str, Any]]:
    errors = []
    inputs = node.get("inputs", {})
    for key, kind in NODES[node["class_type"]].inputs.items():
        value = inputs.get(key)
        if value is None and key not in ("denoise", "filename_prefix"):
            errors.append(_input_error("required_input_missing", "Required input is missing", key))
        elif isinstance(value, list):
            if len(value) != 2 or str(value[0]) not in prompt:
                errors.append(_input_error("bad_linked_input", "Bad linked input", key))
        elif kind == "CKPT" and value not in checkpoints:
            errors.append(
                _input_error(
                    "value_not_in_list",
                    f"Value not in list: {key}: '{value}' not in {list(checkpoints)}",
                    key,
                )
            )
        elif isinstance(kind, tuple) and value not in kind:
            errors.append(
                _input_error(
                    "value_not_in_list",
                    f"Value not in list: {key}: '{value}' not in {list(kind)}",
                    key,
                )
            )
    return errors


def _error(kind: str, message: str, details: str = "") -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": {}}


def _input_error(kind: str, message: str, name: str) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": name, "extra_info": {"input_name": name}}
