"""Graphs for the reference ComfyUI (and for tests): ComfyUI's default txt2img graph in API
format, with a LoRA and a VAE of its own when asked, and a graph with two output branches."""

from __future__ import annotations

from typing import Any


def txt2img_workflow(
    prompt: str,
    *,
    steps: int = 4,
    seed: int = 1,
    size: int = 64,
    ckpt: str = "tiny.safetensors",
    lora: str | None = None,
    vae: str | None = None,
) -> dict[str, Any]:
    """The default ComfyUI txt2img graph in API format (node ids as in ComfyUI's example);
    ``lora``: a ``LoraLoader`` between the checkpoint and its users; ``vae``: a
    ``VAELoader`` whose VAE decodes."""
    model, clip, decoder = ["4", 0], ["4", 1], ["4", 2]
    graph: dict[str, Any] = {
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": seed,
                "steps": steps,
                "cfg": 8.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": model,
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": size, "height": size, "batch_size": 1},
        },
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": clip}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": clip}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": decoder}},
        "9": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]},
        },
    }
    if lora is not None:
        strengths = {"strength_model": 1.0, "strength_clip": 1.0}
        inputs = {"model": ["4", 0], "clip": ["4", 1], "lora_name": lora, **strengths}
        graph["10"] = {"class_type": "LoraLoader", "inputs": inputs}
        model[:], clip[:] = ["10", 0], ["10", 1]  # the checkpoint's users take the LoRA's
    if vae is not None:
        graph["11"] = {"class_type": "VAELoader", "inputs": {"vae_name": vae}}
        decoder[:] = ["11", 0]
    return graph


def two_branch_workflow(prompt: str, *, width: int, steps: int = 2) -> dict[str, Any]:
    """The txt2img graph and a second branch of its own size (``width``) and SaveImage
    (``other``): with a ``width`` below EmptyLatentImage's min, ComfyUI drops that output
    and runs the first."""
    graph = txt2img_workflow(prompt, steps=steps, size=32)
    graph["13"] = {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": width, "height": 32, "batch_size": 1},
    }
    graph["10"] = {
        "class_type": "KSampler",
        "inputs": {**graph["3"]["inputs"], "latent_image": ["13", 0]},
    }
    graph["11"] = {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["4", 2]}}
    graph["12"] = {
        "class_type": "SaveImage",
        "inputs": {"filename_prefix": "other", "images": ["11", 0]},
    }
    return graph
