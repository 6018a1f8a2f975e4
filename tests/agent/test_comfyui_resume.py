"""Resumable sampling on ComfyUI: the reference's split sampling is ComfyUI's (a split run
is the unsplit run bit for bit), and the executor segments a job's sampler, turns each
segment's latent into a checkpoint, and resumes from one with only the steps left."""

from __future__ import annotations

import asyncio
import functools
import io
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from corral.agent.executors.base import Checkpoint, Finished, JobWork, LogLine, Progress, Update
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.reference.comfyui import ReferenceComfyUI, txt2img_workflow
from corral.agent.reference.serve import serving
from corral.agent.testing import Harness, run_to_end
from corral.core import WallClock

pytestmark = pytest.mark.timeout(60)


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@asynccontextmanager
async def comfy() -> AsyncIterator[httpx.AsyncClient]:
    server = ReferenceComfyUI()
    async with serving(server.app) as url, httpx.AsyncClient(base_url=url) as client:
        yield client


async def run(client: httpx.AsyncClient, graph: dict[str, Any]) -> dict[str, Any]:
    answer = await client.post("/prompt", json={"prompt": graph})
    assert answer.status_code == 200, answer.text
    prompt_id = answer.json()["prompt_id"]
    for _ in range(500):
        history = (await client.get(f"/history/{prompt_id}")).json()
        if history:
            entry: dict[str, Any] = history[prompt_id]
            assert entry["status"]["status_str"] == "success", entry["status"]
            return entry
        await asyncio.sleep(0.02)
    raise AssertionError("the prompt never ended")


async def saved(client: httpx.AsyncClient, entry: dict[str, Any], node: str, kind: str) -> bytes:
    ref = entry["outputs"][node][kind][0]
    return (await client.get("/view", params=ref)).content


def pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB").tobytes()


def advanced(graph: dict[str, Any], **settings: Any) -> dict[str, Any]:
    """The graph's KSampler "3" as a KSamplerAdvanced with ``settings``."""
    inputs = dict(graph["3"]["inputs"])
    inputs["noise_seed"] = inputs.pop("seed")
    inputs.pop("denoise")
    inputs.update(add_noise="enable", start_at_step=0, end_at_step=10000)
    inputs.update(return_with_leftover_noise="disable")
    inputs.update(settings)
    return {**graph, "3": {"class_type": "KSamplerAdvanced", "inputs": inputs}}


def first_half(graph: dict[str, Any], leftover: str) -> dict[str, Any]:
    """Steps 0..4 of 10 saved as a latent (nothing decoded)."""
    graph = advanced(graph, end_at_step=4, return_with_leftover_noise=leftover)
    keep = {k: v for k, v in graph.items() if k not in ("8", "9")}
    save = {"samples": ["3", 0], "filename_prefix": "latents/half"}
    return {**keep, "20": {"class_type": "SaveLatent", "inputs": save}}


@in_loop
async def test_split_sampling_with_a_saved_latent_is_the_unsplit_image_bit_for_bit() -> None:
    async with comfy() as client:
        graph = txt2img_workflow("a lighthouse", steps=10, seed=7, size=64)
        whole = pixels(await saved(client, await run(client, graph), "9", "images"))
        as_advanced = pixels(await saved(client, await run(client, advanced(graph)), "9", "images"))
        assert as_advanced == whole

        half = await saved(client, await run(client, first_half(graph, "enable")), "20", "latents")
        upload = await client.post(
            "/upload/image",
            files={"image": ("half.latent", half)},
            data={"type": "temp", "subfolder": "t"},
        )
        ref = f"t/{upload.json()['name']} [temp]"
        rest = advanced(graph, add_noise="disable", start_at_step=4)
        rest["30"] = {"class_type": "LoadLatent", "inputs": {"latent": ref}}
        rest["3"]["inputs"]["latent_image"] = ["30", 0]
        resumed = pixels(await saved(client, await run(client, rest), "9", "images"))
        assert resumed == whole

        # a first segment fully denoised at its end (leftover noise dropped) is another image
        denoised = await run(client, first_half(graph, "disable"))
        early = await saved(client, denoised, "20", "latents")
        assert early != half
        missing = {"30": {"class_type": "LoadLatent", "inputs": {"latent": "none.latent"}}}
        refused = await client.post("/prompt", json={"prompt": {**rest, **missing}})
        assert refused.status_code == 400
        assert "Invalid latent file: none.latent" in refused.text


def job(
    tmp: Path, graph: dict[str, Any], resume: Checkpoint | None = None, **extra: Any
) -> JobWork:
    return JobWork(
        allocation_id="a1",
        attempt=2 if resume else 1,
        job_ids=("j1",),
        kind="sample",
        payload={"workflow": graph, **extra},
        checkpoint_dir=tmp / ("b" if resume else "a"),
        resume_from=resume.path if resume else None,
        resume_step=resume.step if resume else 0,
    )


async def execute(client: httpx.AsyncClient, work: JobWork) -> list[Update]:
    executor = ComfyUIExecutor(str(client.base_url), WallClock(), reconcile_interval_s=0.05)
    return await run_to_end(Harness(executor, WallClock(), lambda s, a: work), work)


def image_of(updates: list[Update]) -> bytes:
    end = updates[-1]
    assert isinstance(end, Finished), end
    names = [r.name for r in end.results]
    assert not any(n.endswith(".latent") for n in names), "segment latents are not results"
    return pixels(next(r for r in end.results if r.name.endswith(".png")).read())


@in_loop
async def test_the_executor_checkpoints_each_segment_and_resumes_with_the_steps_left(
    tmp_path: Path,
) -> None:
    async with comfy() as client:
        graph = txt2img_workflow("a harbour", steps=10, seed=3, size=64)
        plain = await execute(client, job(tmp_path / "plain", graph))
        first = await execute(client, job(tmp_path, graph, checkpoint_steps=3))
        marks = [u for u in first if isinstance(u, Checkpoint)]
        assert [m.step for m in marks] == [3, 6, 9]
        assert json.loads((Path(marks[1].path) / "resume.json").read_text())["node"] == "3"
        assert image_of(first) == image_of(plain)
        steps = [u.step for u in first if isinstance(u, Progress) and u.total]
        assert steps == sorted(steps), "one run of 10 steps, not one count per segment"
        assert steps[-1] == 10

        again = await execute(client, job(tmp_path, graph, marks[1], checkpoint_steps=3))
        assert image_of(again) == image_of(plain)
        sampled = [u for u in again if isinstance(u, Progress) and u.total]
        assert sampled[0].step == 6
        assert sampled[0].message == "resumed from step 6"
        assert {u.step for u in sampled[1:]} == {7, 8, 9, 10}, "only the steps left ran"
        assert [u.step for u in again if isinstance(u, Checkpoint)] == [9]


@in_loop
async def test_a_sampler_that_splitting_would_change_runs_whole_and_says_so(
    tmp_path: Path,
) -> None:
    async with comfy() as client:
        graph = txt2img_workflow("a harbour", steps=6, seed=3, size=64)
        graph["3"]["inputs"]["sampler_name"] = "dpmpp_2m"
        updates = await execute(client, job(tmp_path, graph, checkpoint_steps=2))
        assert not [u for u in updates if isinstance(u, Checkpoint)]
        notes = [u.line for u in updates if isinstance(u, LogLine) and "unsegmented" in u.line]
        assert notes == [
            "comfyui: node 3 (KSampler) runs unsegmented: sampler 'dpmpp_2m' does not "
            "give the same image split"
        ]
        assert isinstance(updates[-1], Finished)
