"""Resumable sampling for Python handlers that run a diffusers pipeline.

A handler samples through ``resumable_sample`` instead of calling the pipeline
itself; every ``every`` steps it writes the latents, the scheduler's state and
the generator's state into ``ctx.checkpoint_dir`` and yields them as a
``Checkpoint``; on an attempt that resumes (``ctx.resume_from``) it restores
all three and runs only the steps left::

    def handler(ctx):
        pipe = load_pipeline()
        generator = torch.Generator().manual_seed(ctx.payload["seed"])
        out = yield from resumable_sample(
            pipe, ctx, every=5, generator=generator,
            prompt=ctx.payload["prompt"], num_inference_steps=40,
        )
        return {"image.png": to_png(out.images[0])}

It drives the pipeline's own loop (text-to-image pipelines that set their
timesteps, then prepare their latents, then loop: ``StableDiffusionPipeline``,
``StableDiffusionXLPipeline``): on a resume the scheduler is set up for the
whole run and then given its saved state, the loop is handed the remaining
timesteps, and the saved latents replace the initial noise, with the
generator as it was at that step (ancestral schedulers draw from it). Every
step then computes what the uninterrupted run computed: on CPU the image is
the same bit for bit. On a GPU it is the same when the run is deterministic
(``torch.use_deterministic_algorithms(True)``, the same GPU model, driver and
library versions); otherwise kernels that pick their algorithm per run or sum
in another order differ in the last bits per step, and the image differs
about as much as two uninterrupted GPU runs of that seed do.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

import torch

from corral.agent.executors.base import Checkpoint, Progress
from corral.agent.executors.python import HandlerContext

STATE = "sampling.pt"
_PLAIN = (type(None), bool, int, float, str, torch.Tensor)


def resumable_sample(
    pipe: Any, ctx: HandlerContext, *, every: int, generator: torch.Generator, **call: Any
) -> Generator[Progress | Checkpoint, None, Any]:
    """Run ``pipe(**call, generator=generator)``, checkpointing every ``every`` steps and
    resuming from ``ctx.resume_from``; yields progress and checkpoints, returns the output."""
    if every < 1:
        raise ValueError("every must be at least 1 step")
    total = int(call.get("num_inference_steps", 50))
    saved = _load(ctx.resume_from)
    first = int(saved["step"]) if saved else 0
    updates: queue.Queue[Progress | Checkpoint | _End] = queue.Queue()
    if saved:
        updates.put(Progress(first / total, first, total, f"resumed from step {first}"))

    def on_step(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        step = first + i + 1
        updates.put(Progress(step / total, step, total))
        if step % every == 0 and step < total and ctx.checkpoint_dir is not None:
            path = _save(ctx.checkpoint_dir, step, kwargs["latents"], p.scheduler, generator)
            updates.put(Checkpoint(str(path), step, step / total))
        return kwargs

    def work() -> None:
        try:
            with _resumed(pipe, saved, generator):
                result = pipe(**call, generator=generator, callback_on_step_end=on_step)
            updates.put(_End(result, None))
        except BaseException as exc:  # handed to the handler's thread, raised there
            updates.put(_End(None, exc))

    threading.Thread(target=work, daemon=True, name="corral-sampling").start()
    while not isinstance(item := updates.get(), _End):
        yield item
    if item.error is not None:
        raise item.error
    return item.result


class _End:
    def __init__(self, result: Any, error: BaseException | None) -> None:
        self.result, self.error = result, error


def _save(
    folder: Path, step: int, latents: torch.Tensor, scheduler: Any, generator: torch.Generator
) -> Path:
    """``sampling-<step>/sampling.pt``, written whole then renamed (a reader never sees half)."""
    state = {k: _copy(v) for k, v in vars(scheduler).items() if _plain(v)}
    target = folder / f"sampling-{step:06d}"
    temp = folder / f".sampling-{step:06d}.tmp"
    temp.mkdir(parents=True, exist_ok=True)
    payload = {"step": step, "latents": latents.clone(), "scheduler": state}
    torch.save({**payload, "generator": generator.get_state()}, temp / STATE)
    temp.rename(target)
    return target


def _load(path: str | None) -> dict[str, Any] | None:
    """The saved state of a ``resume_from`` directory; None when it holds none."""
    file = Path(path) / STATE if path else None
    if file is None or not file.is_file():
        return None
    state: dict[str, Any] = torch.load(file, weights_only=True)  # tensors and numbers only
    return state


class _resumed:
    """While the pipeline runs: after it sets its timesteps, restore the scheduler and hand
    the loop only the timesteps left; in place of its first noise, the saved latents."""

    def __init__(self, pipe: Any, saved: dict[str, Any] | None, generator: torch.Generator):
        self.pipe, self.saved, self.generator = pipe, saved, generator

    def __enter__(self) -> None:
        if self.saved is None:
            return
        scheduler, saved, state = self.pipe.scheduler, self.saved, self.saved["scheduler"]
        set_timesteps = scheduler.set_timesteps
        full: list[Any] = []

        def set_then_restore(*args: Any, **kwargs: Any) -> None:
            set_timesteps(*args, **kwargs)
            for key, value in state.items():
                setattr(scheduler, key, _copy(value))
            full.append(scheduler.timesteps)
            scheduler.timesteps = scheduler.timesteps[int(saved["step"]) :]  # what the loop runs

        def prepare_latents(*args: Any, **kwargs: Any) -> torch.Tensor:
            scheduler.timesteps = full[-1]  # the scheduler itself sees the whole run
            self.generator.set_state(saved["generator"])
            latents: torch.Tensor = saved["latents"].clone()
            return latents

        scheduler.set_timesteps = set_then_restore
        self.pipe.prepare_latents = prepare_latents

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            del self.pipe.scheduler.set_timesteps  # the class's own again
            del self.pipe.prepare_latents


def _plain(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(isinstance(v, _PLAIN) for v in value)
    return isinstance(value, _PLAIN)


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(_copy(v) for v in value)
    return value
