"""A Python handler's diffusers sampling through ``resumable_sample``: checkpoints every K
steps, and an attempt resumed from one runs only the steps left and makes the same image as
an uninterrupted run, bit for bit on CPU (the reference's tiny random-weight pipeline)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from pathlib import Path
from typing import Any

import diffusers
import numpy as np
import pytest
import torch

from corral.agent.diffusion_resume import resumable_sample
from corral.agent.executors.base import Checkpoint, Finished, JobWork, Progress, Update
from corral.agent.executors.python import HandlerContext, PythonExecutor
from corral.agent.reference.tiny_diffusion import tiny_pipeline
from corral.agent.testing import Harness, run_to_end
from corral.core import WallClock

pytestmark = pytest.mark.timeout(120)
SCHEDULERS: dict[str, Any] = {
    "ddim": diffusers.DDIMScheduler,
    "euler": diffusers.EulerDiscreteScheduler,  # scales its noise: init_noise_sigma != 1
    "euler_ancestral": diffusers.EulerAncestralDiscreteScheduler,  # draws from the generator
    "dpmpp_2m": diffusers.DPMSolverMultistepScheduler,  # remembers earlier steps
}


def pipeline(scheduler: str) -> Any:
    base = tiny_pipeline(3)
    components = dict(base.components, requires_safety_checker=False)
    components["scheduler"] = SCHEDULERS[scheduler].from_config(base.scheduler.config)
    pipe = diffusers.StableDiffusionPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def handler(ctx: HandlerContext) -> Generator[Any, None, dict[str, bytes]]:
    pipe = pipeline(str(ctx.payload["scheduler"]))
    ids = torch.tensor([[1, 17, 99, 2] + [0] * 12])
    with torch.no_grad():
        embeds = pipe.text_encoder(ids)[0]
        out = yield from resumable_sample(
            pipe,
            ctx,
            every=3,
            generator=torch.Generator().manual_seed(11),
            prompt_embeds=embeds,
            negative_prompt_embeds=torch.zeros_like(embeds),
            num_inference_steps=10,
            height=32,
            width=32,
            output_type="np",
        )
    image: np.ndarray[Any, Any] = out.images[0]
    return {"image.npy": image.tobytes()}


def run(tmp: Path, scheduler: str, resume: Checkpoint | None = None) -> list[Update]:
    job = JobWork(
        "a",
        2 if resume else 1,
        ("j",),
        payload={"scheduler": scheduler},
        checkpoint_dir=tmp / ("second" if resume else "first"),
        resume_from=resume.path if resume else None,
        resume_step=resume.step if resume else 0,
    )
    executor = PythonExecutor(handler, WallClock())
    return asyncio.run(run_to_end(Harness(executor, WallClock(), lambda s, a: job), job))


def image(updates: list[Update]) -> bytes:
    end = updates[-1]
    assert isinstance(end, Finished), end
    return end.results[0].read()


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
# diffusers' DPM-Solver hands numpy a torch tensor the way numpy 2 deprecates (not ours)
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
def test_a_resumed_sample_is_the_uninterrupted_image_bit_for_bit(
    tmp_path: Path, scheduler: str
) -> None:
    first = run(tmp_path, scheduler)
    assert isinstance(first[-1], Finished), first[-1]
    marks = [u for u in first if isinstance(u, Checkpoint)]
    assert [m.step for m in marks] == [3, 6, 9]
    resumed = run(tmp_path, scheduler, marks[1])
    assert image(resumed) == image(first)
    steps = [u.step for u in resumed if isinstance(u, Progress) and u.total]
    assert steps == [6, 7, 8, 9, 10], "it starts at the checkpoint and runs only what is left"
    assert [u.step for u in resumed if isinstance(u, Checkpoint)] == [9]
