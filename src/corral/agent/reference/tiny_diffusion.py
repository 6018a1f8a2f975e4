"""A real Stable Diffusion pipeline with a tiny, randomly initialised model.

UNet, VAE and CLIP text encoder are built from small configs with a fixed
seed (nothing is downloaded), so a 32x32 image takes a few milliseconds per
step on a CPU while the step callbacks, the latents behind the previews and
the interrupt path are diffusers' own. Prompts are tokenised by hashing words
(a tokenizer would need vocabulary files): same prompt, same embedding.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import diffusers
import torch
from PIL import Image
from transformers import CLIPTextConfig, CLIPTextModel

_diffusers: Any = diffusers  # its classes are untyped for mypy --strict: use them as Any

VOCAB = 1000
TOKENS = 16
OnStep = Callable[[int, int, Image.Image], bool]
"""(step, total, preview) -> True to interrupt the generation."""

_build_lock = threading.Lock()


@cache
def tiny_pipeline(seed: int) -> Any:
    """The pipeline for one 'checkpoint'; different seeds are different models."""
    with _build_lock:
        torch.set_num_threads(1)  # a tiny model gains nothing from threads; share the CPU
        torch.manual_seed(seed)
        unet = _diffusers.UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(8, 16),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=16,
            attention_head_dim=2,
            norm_num_groups=4,
        )
        vae = _diffusers.AutoencoderKL(
            block_out_channels=(8, 16),
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            latent_channels=4,
            norm_num_groups=4,
            layers_per_block=1,
        )
        text_config = CLIPTextConfig(
            hidden_size=16,
            intermediate_size=32,
            num_attention_heads=2,
            num_hidden_layers=1,
            vocab_size=VOCAB,
            max_position_embeddings=TOKENS,
            projection_dim=16,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        text_encoder = CLIPTextModel(text_config)
        pipe = _diffusers.StableDiffusionPipeline(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=None,
            unet=unet,
            scheduler=_diffusers.DDIMScheduler(steps_offset=1, clip_sample=False),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe


@dataclass(frozen=True, slots=True)
class Generation:
    """One image to make: txt2img, or img2img when ``init_image`` is set."""

    prompt: str
    negative_prompt: str = ""
    steps: int = 4
    width: int = 32
    height: int = 32
    seed: int = 0
    cfg_scale: float = 7.0
    init_image: Image.Image | None = None
    denoising_strength: float = 0.75


def generate(model_seed: int, job: Generation, on_step: OnStep) -> Image.Image:
    """One image; stops early (and decodes what it has) when ``on_step`` says so."""
    pipe = tiny_pipeline(model_seed)
    generator = torch.Generator().manual_seed(job.seed)

    def callback(p: Any, step: int, timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if on_step(step + 1, job.steps, _decode(pipe, kwargs["latents"])):
            p._interrupt = True  # diffusers skips the remaining steps, then decodes
        return kwargs

    common: dict[str, Any] = {
        "prompt_embeds": _embed(pipe, job.prompt),
        "negative_prompt_embeds": _embed(pipe, job.negative_prompt),
        "num_inference_steps": job.steps,
        "guidance_scale": job.cfg_scale,
        "generator": generator,
        "callback_on_step_end": callback,
        "output_type": "pil",
    }
    with torch.no_grad():
        if job.init_image is None:
            out = pipe(height=job.height, width=job.width, **common)
        else:
            image = job.init_image.convert("RGB").resize((job.width, job.height))
            out = _img2img(model_seed)(image=image, strength=job.denoising_strength, **common)
    result: Image.Image = out.images[0]
    return result


@cache
def _img2img(model_seed: int) -> Any:
    """The same model's components behind the img2img pipeline."""
    components = dict(tiny_pipeline(model_seed).components, requires_safety_checker=False)
    img2img = _diffusers.StableDiffusionImg2ImgPipeline(**components)
    img2img.set_progress_bar_config(disable=True)
    return img2img


def _embed(pipe: Any, text: str) -> torch.Tensor:
    words = [zlib.crc32(w.encode()) % (VOCAB - 3) + 3 for w in text.lower().split()]
    ids = [1, *words[: TOKENS - 2], 2]
    ids += [0] * (TOKENS - len(ids))
    embeds: torch.Tensor = pipe.text_encoder(torch.tensor([ids]))[0]
    return embeds


def _decode(pipe: Any, latents: torch.Tensor) -> Image.Image:
    """What the image looks like now: the latents through the VAE (A1111's "Full" preview)."""
    with torch.no_grad():
        scaled = latents / pipe.vae.config.scaling_factor
        pixels = pipe.vae.decode(scaled).sample
    array = ((pixels[0].clamp(-1, 1) + 1) * 127.5).permute(1, 2, 0).to(torch.uint8).numpy()
    return Image.fromarray(array)
