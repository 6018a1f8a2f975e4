"""The AUTOMATIC1111 executor against the reference webui (real diffusers on CPU) over HTTP."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from PIL import Image

from corral.agent.executors.base import (
    Failed,
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
    Update,
)
from corral.agent.executors.http_a1111 import A1111Executor
from corral.agent.reference.a1111 import ReferenceA1111
from corral.agent.reference.serve import free_port, serving
from corral.agent.testing import CHECKS, Harness, run_to_end
from corral.core import WallClock

SMALL = {"width": 32, "height": 32}
SCENARIOS: dict[str, dict[str, Any]] = {
    "quick": {"prompt": "a red fox", "steps": 3, "seed": 7, **SMALL},
    "failing": {"prompt": "a red fox", "steps": 3, "sampler_name": "No Such Sampler", **SMALL},
    "long": {"prompt": "a slow fox", "steps": 500, "n_iter": 20, **SMALL},
    "lacking": {"prompt": "a red fox <lora:fur-detail:0.7>", "steps": 3, **SMALL},
    # img2img of the job's input file (the executor sends it as init_images)
    "input": {"mode": "img2img", "prompt": "a fox", "steps": 2, "seed": 7, **SMALL},
}


def png_of(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(out, format="PNG")
    return out.getvalue()


def make(scenario: str, alloc: str) -> JobWork:
    return JobWork(alloc, 1, (f"job-{alloc}",), kind="sample", payload=SCENARIOS[scenario])


@asynccontextmanager
async def webui(**kwargs: Any) -> AsyncIterator[tuple[ReferenceA1111, Harness]]:
    server = ReferenceA1111(**kwargs)
    async with serving(server.app) as url:
        executor = A1111Executor(url, WallClock(), poll_interval_s=0.02)
        inputs = (png_of((250, 0, 0)), png_of((0, 0, 250)))
        yield (
            server,
            Harness(executor, WallClock(), make, lacking="lora:fur-detail", input_files=inputs),
        )


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_a1111_executor_passes_the_conformance_suite(
    check: Callable[[Harness], Awaitable[None]],
) -> None:
    async def scenario() -> None:
        # Each step lasts a few polls, so a preview is seen even when the tiny model is
        # faster than one poll (the webui shows a step's image only until the next).
        async with webui(step_delay_s=0.05) as (_, harness):
            await check(harness)

    asyncio.run(scenario())


def run_against(job: JobWork, **server_kwargs: Any) -> tuple[ReferenceA1111, list[Update]]:
    async def scenario() -> tuple[ReferenceA1111, list[Update]]:
        async with webui(**server_kwargs) as (server, harness):
            return server, await run_to_end(harness, job)

    return asyncio.run(scenario())


def png(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def test_live_progress_and_previews_come_from_real_diffusion_steps() -> None:
    job = JobWork("a", 1, ("j",), payload={"prompt": "a fox", "steps": 4, "seed": 1, **SMALL})
    _, updates = run_against(job, step_delay_s=0.05)
    steps = [u.step for u in updates if isinstance(u, Progress) and u.step]
    assert steps == sorted(steps)
    assert set(steps) <= {1, 2, 3, 4}
    assert steps, "polling saw no sampling step"
    previews = [u for u in updates if isinstance(u, Preview)]
    assert previews, "no live preview"
    assert png(previews[0].image).size == (32, 32)
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    assert png(terminal.results[0].data).size == (32, 32)


def test_the_same_seed_gives_the_same_image_and_a_random_seed_is_reported() -> None:
    fixed = JobWork("a", 1, ("j",), payload={"prompt": "a fox", "steps": 2, "seed": 5, **SMALL})
    _, first = run_against(fixed)
    _, second = run_against(fixed)
    assert isinstance(first[-1], Finished)
    assert isinstance(second[-1], Finished)
    assert first[-1].results[0].data == second[-1].results[0].data
    assert "seed" not in first[-1].modified
    drawn = JobWork("b", 1, ("k",), payload={"prompt": "a fox", "steps": 2, **SMALL})
    _, updates = run_against(drawn)
    assert isinstance(updates[-1], Finished)
    assert updates[-1].modified["seed"].isdigit()


def test_the_sampler_the_webui_chose_is_reported_only_when_none_was_named() -> None:
    chosen = JobWork("a", 1, ("j",), payload={"prompt": "a fox", "steps": 2, **SMALL})
    _, updates = run_against(chosen)
    assert isinstance(updates[-1], Finished)
    assert updates[-1].modified["sampler_name"] == "Euler a"  # the reference webui's default
    named = {"prompt": "a fox", "steps": 2, "sampler_name": "Euler a", **SMALL}
    _, updates = run_against(JobWork("b", 1, ("k",), payload=named))
    assert isinstance(updates[-1], Finished)
    assert "sampler_name" not in updates[-1].modified


def test_a_job_without_a_model_reports_the_loaded_one() -> None:
    _, updates = run_against(make("quick", "a"))
    assert isinstance(updates[-1], Finished)
    assert updates[-1].modified["model"].startswith("tiny-sd.safetensors [")


def test_a_job_naming_another_model_switches_the_checkpoint_first() -> None:
    job = JobWork("a", 1, ("j",), model="tiny-sd-v2", payload=SCENARIOS["quick"])
    server, updates = run_against(job)
    assert server.loaded == "tiny-sd-v2"
    switch = [u.line for u in updates if isinstance(u, LogLine)]
    assert switch == [f"switched checkpoint from {title('tiny-sd')} to {title('tiny-sd-v2')}"]
    assert isinstance(updates[-1], Finished)
    assert "model" not in updates[-1].modified


def title(model: str) -> str:
    import hashlib

    return f"{model}.safetensors [{hashlib.sha256(model.encode()).hexdigest()[:10]}]"


def test_an_unknown_model_fails_saying_what_the_backend_has() -> None:
    job = JobWork("a", 1, ("j",), model="sdxl-turbo", payload=SCENARIOS["quick"])
    _, updates = run_against(job)
    assert updates[-1] == Failed(
        'a1111: models missing on this node: ["sdxl-turbo"] (it has: tiny-sd, tiny-sd-v2)',
        retryable=True,
    )


def test_img2img_and_upscale() -> None:
    _, base = run_against(make("quick", "a"))
    assert isinstance(base[-1], Finished)
    image = base64.b64encode(base[-1].results[0].data).decode()
    i2i = {
        "mode": "img2img",
        "init_images": [image],
        "steps": 4,
        "denoising_strength": 0.5,
        **SMALL,
    }
    _, updates = run_against(JobWork("b", 1, ("k",), payload=i2i))
    assert isinstance(updates[-1], Finished)
    assert png(updates[-1].results[0].data).size == (32, 32)
    up = {"mode": "upscale", "image": image, "upscaling_resize": 2, "upscaler_1": "Lanczos"}
    _, upscaled = run_against(JobWork("c", 1, ("l",), payload=up))
    assert isinstance(upscaled[-1], Finished)
    assert png(upscaled[-1].results[0].data).size == (64, 64)


def test_backend_down_is_a_retryable_failure_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    harness = Harness(A1111Executor(url, WallClock()), WallClock(), make)
    terminal = asyncio.run(run_to_end(harness, make("quick", "a")))[-1]
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert f"a1111 backend at {url} is unreachable" in terminal.error


def test_backend_500_is_a_clear_retryable_failure() -> None:
    async def scenario() -> Update:
        async with webui() as (server, harness):
            server.fail_next = "CUDA out of memory. Tried to allocate 2.00 GiB"
            return (await run_to_end(harness, make("quick", "a")))[-1]

    assert asyncio.run(scenario()) == Failed(
        "a1111 answered HTTP 500 to /sdapi/v1/txt2img: OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        retryable=True,
    )


def test_bad_requests_fail_for_good_with_the_backends_message() -> None:
    _, updates = run_against(JobWork("a", 1, ("j",), payload={"steps": "many", **SMALL}))
    terminal = updates[-1]
    assert isinstance(terminal, Failed)
    assert not terminal.retryable
    assert "HTTP 422 to /sdapi/v1/txt2img" in terminal.error
    assert "steps" in terminal.error


def test_a_slow_backend_hits_the_job_timeout_and_is_interrupted() -> None:
    async def scenario() -> tuple[ReferenceA1111, list[Update]]:
        async with webui(step_delay_s=0.05) as (server, harness):
            job = JobWork("a", 1, ("j",), payload={"steps": 400, **SMALL}, timeout_s=0.5)
            updates = await run_to_end(harness, job)
            # the webui is free again: the interrupt reached it
            async with httpx.AsyncClient() as client:
                state = (await client.get(f"{harness.executor._base_url}/sdapi/v1/progress")).json()  # type: ignore[attr-defined]
            assert state["state"]["job_count"] == 0
            return server, updates

    server, updates = asyncio.run(scenario())
    terminal = updates[-1]
    assert isinstance(terminal, Failed)
    assert terminal.error == "timed out: after 0.5s"
    assert server.generations == 1


def test_a_slow_answer_to_a_small_call_is_a_retryable_timeout() -> None:
    async def scenario() -> Update:
        server = ReferenceA1111()
        server.slow_calls_s = 1.0
        async with serving(server.app) as url:
            executor = A1111Executor(url, WallClock(), request_timeout_s=0.2)
            return (await run_to_end(Harness(executor, WallClock(), make), make("quick", "a")))[-1]

    terminal = asyncio.run(scenario())
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert "did not answer in time (ReadTimeout)" in terminal.error


def test_info_is_json_inside_a_string_like_the_real_webui() -> None:
    async def scenario() -> dict[str, Any]:
        server = ReferenceA1111()
        async with serving(server.app) as url, httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/sdapi/v1/txt2img", json={"steps": 1, "seed": 3, **SMALL})
            return dict(response.json())

    body = asyncio.run(scenario())
    assert isinstance(body["info"], str)
    info = json.loads(body["info"])
    assert info["seed"] == 3
    assert info["all_seeds"] == [3]
    assert info["sd_model_name"] == "tiny-sd"


def test_a_restarted_job_asking_for_a_random_seed_makes_the_same_image_elsewhere() -> None:
    payload = {"prompt": "a fox", "steps": 3, "seed": -1, **SMALL}
    _, first = run_against(JobWork("a", 1, ("job-1",), payload=payload))
    # the machine was lost: attempt 2 samples again from step 0, on another webui
    _, again = run_against(JobWork("b", 2, ("job-1",), payload=payload))
    _, other = run_against(JobWork("c", 1, ("job-2",), payload=payload))
    ends = [u[-1] for u in (first, again, other)]
    assert all(isinstance(e, Finished) for e in ends)
    one, two, three = (e for e in ends if isinstance(e, Finished))
    assert one.results[0].data == two.results[0].data
    assert one.modified["seed"] == two.modified["seed"] != three.modified["seed"]
    notes = [u.line for u in again if isinstance(u, LogLine)]
    assert any(f"from step 0 with seed {two.modified['seed']}" in n for n in notes)
    assert not [u for u in first if isinstance(u, LogLine) and "step 0" in u.line]
