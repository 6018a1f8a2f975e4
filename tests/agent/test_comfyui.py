"""The ComfyUI executor against the reference ComfyUI server over real HTTP and websockets."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from websockets.asyncio.client import connect

from corral.agent.executors.base import (
    Failed,
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
    StopSignal,
    Update,
)
from corral.agent.executors.comfyui_outputs import OUTPUTS_MANIFEST
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.reference.comfyui import (
    ReferenceComfyUI,
    two_branch_workflow,
    txt2img_workflow,
)
from corral.agent.reference.serve import free_port, serving
from corral.agent.testing import CHECKS, INPUT_NAME, Harness, run_to_end
from corral.core import WallClock
from corral.core.states import StopReason


def workflow_job(alloc: str, model: str | None = None, **kwargs: Any) -> JobWork:
    payload = {"workflow": txt2img_workflow("a lighthouse at dusk", **kwargs)}
    return JobWork(alloc, 1, (f"job-{alloc}",), kind="sample", payload=payload, model=model)


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(out, format="PNG")
    return out.getvalue()


def make(scenario: str, alloc: str) -> JobWork:
    if scenario == "quick":
        return workflow_job(alloc, steps=3)
    if scenario == "failing":  # refused on every node: KSampler takes at least one step
        return workflow_job(alloc, steps=0)
    if scenario == "lacking":
        workflow = txt2img_workflow("a lighthouse", steps=2, lora="missing-lora.safetensors")
        return JobWork(alloc, 1, (f"job-{alloc}",), payload={"workflow": workflow})
    if scenario == "input":  # the job's input file, inverted and saved
        graph = {
            "1": {"class_type": "LoadImage", "inputs": {"image": INPUT_NAME}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {
                "class_type": "SaveImage",
                "inputs": {"images": ["2", 0], "filename_prefix": "in"},
            },
        }
        return JobWork(alloc, 1, (f"job-{alloc}",), payload={"workflow": graph})
    if scenario == "invalid":
        workflow = two_branch_workflow("half", width=0)
        return JobWork(alloc, 1, (f"job-{alloc}",), payload={"workflow": workflow})
    return workflow_job(alloc, steps=10_000)  # KSampler's max: runs until stopped


@asynccontextmanager
async def comfy(**kwargs: Any) -> AsyncIterator[tuple[ReferenceComfyUI, Harness]]:
    kwargs.setdefault("preview_method", "auto")
    kwargs.setdefault("step_delay_s", 0.005)
    server = ReferenceComfyUI(**kwargs)
    async with serving(server.app) as url:
        executor = ComfyUIExecutor(url, WallClock(), reconcile_interval_s=0.05)
        yield (
            server,
            Harness(
                executor,
                WallClock(),
                make,
                partial_results=False,
                invalid_reason="node #13 (EmptyLatentImage) input width: Value 0 smaller than min",
                forget_outputs=lambda: forget(server),
                lacking="lora:missing-lora.safetensors",
                input_files=(png((255, 0, 0)), png((0, 0, 255))),
            ),
        )


def forget(server: ReferenceComfyUI) -> None:
    """Someone cleans ComfyUI's output folder (its cache still points at the files)."""
    for path in server.output_dir.rglob("*"):
        if path.is_file():
            path.unlink()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_comfyui_executor_passes_the_conformance_suite(
    check: Callable[[Harness], Awaitable[None]],
) -> None:
    async def scenario() -> None:
        async with comfy() as (_, harness):
            await check(harness)

    asyncio.run(scenario())


def run_against(job: JobWork, on_update: Any = None, **server: Any) -> list[Update]:
    async def scenario() -> list[Update]:
        async with comfy(**server) as (_, harness):
            return await run_to_end(harness, job, on_update)

    return asyncio.run(scenario())


def test_progress_previews_and_outputs_of_a_workflow() -> None:
    updates = run_against(workflow_job("a", steps=4, size=64))
    steps = [(u.step, u.total) for u in updates if isinstance(u, Progress) and u.total]
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]
    previews = [u for u in updates if isinstance(u, Preview)]
    assert len(previews) == 4
    assert all(p.mime == "image/jpeg" for p in previews)
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    result, manifest = terminal.results
    assert manifest.name == OUTPUTS_MANIFEST
    assert result.name == "ComfyUI_00001_.png"
    assert Image.open(io.BytesIO(result.data)).size == (64, 64)
    assert dict(terminal.modified) == {"model": "tiny.safetensors"}


def test_no_previews_unless_the_server_was_started_with_a_preview_method() -> None:
    updates = run_against(workflow_job("a", steps=3), preview_method="none")
    assert not [u for u in updates if isinstance(u, Preview)]
    assert isinstance(updates[-1], Finished)


def test_the_jobs_model_replaces_the_workflows_checkpoint() -> None:
    good = run_against(workflow_job("a", model="tiny-v2.safetensors", steps=2))
    assert isinstance(good[-1], Finished)
    assert dict(good[-1].modified) == {}
    bad = run_against(workflow_job("b", model="sdxl.safetensors", steps=2))[-1]
    assert isinstance(bad, Failed)
    assert bad.retryable  # another node may have it
    assert bad.error == (
        'comfyui: models missing on this node: ["sdxl.safetensors"] ('
        "comfyui refused the prompt: Prompt outputs failed validation: node #4"
        " (CheckpointLoaderSimple) input ckpt_name: Value not in list: ckpt_name:"
        " 'sdxl.safetensors' not in ['tiny.safetensors', 'tiny-v2.safetensors'])"
    )


def test_an_error_during_execution_names_the_node() -> None:
    async def scenario() -> Update:
        async with comfy() as (server, harness):
            server.fail_next = "CUDA out of memory"
            return (await run_to_end(harness, workflow_job("a", steps=3)))[-1]

    assert asyncio.run(scenario()) == Failed(
        "comfyui: RuntimeError in node 3 (KSampler): CUDA out of memory", retryable=False
    )


def test_after_a_websocket_drop_the_outcome_comes_from_history() -> None:
    async def scenario() -> list[Update]:
        async with comfy(step_delay_s=0.02) as (server, harness):
            dropped = False

            def drop_once(update: Update, stop: StopSignal) -> None:
                nonlocal dropped
                if isinstance(update, Progress) and not dropped:
                    dropped = True
                    asyncio.get_running_loop().create_task(server.drop_websockets())

            return await run_to_end(harness, workflow_job("a", steps=20), drop_once)

    updates = asyncio.run(scenario())
    assert LogLine("websocket dropped; reconciling through /history", "agent") in updates
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    assert [r.name for r in terminal.results] == ["ComfyUI_00001_.png", OUTPUTS_MANIFEST]


def test_a_prompt_interrupted_before_it_started_is_taken_off_the_queue() -> None:
    async def scenario() -> tuple[list[Update], list[Update], list[Any]]:
        async with comfy(step_delay_s=0.01) as (_, harness):
            running = asyncio.Event()
            first = asyncio.create_task(
                run_to_end(harness, workflow_job("a", steps=100), lambda u, s: running.set())
            )
            await running.wait()  # the first prompt is running: the second must queue
            stop = StopSignal()
            second = asyncio.create_task(run_to_end(harness, workflow_job("b", steps=3), stop=stop))
            async with httpx.AsyncClient() as client:
                url = harness.executor._base_url  # type: ignore[attr-defined]
                while not (await client.get(f"{url}/queue")).json()["queue_pending"]:
                    await asyncio.sleep(0.01)
                stop.request(StopReason.CANCEL, 5.0)
                second_updates = await second
                pending = (await client.get(f"{url}/queue")).json()["queue_pending"]
            return await first, second_updates, pending

    first, second, pending = asyncio.run(scenario())
    assert isinstance(first[-1], Finished)
    assert isinstance(second[-1], Failed)
    assert second[-1].stopped is StopReason.CANCEL
    assert pending == []


def test_interrupt_keeps_the_outputs_already_saved() -> None:
    workflow = txt2img_workflow("two pictures", steps=2)
    workflow["10"] = {
        "class_type": "KSampler",
        "inputs": {**workflow["3"]["inputs"], "steps": 10_000},
    }
    workflow["11"] = {"class_type": "VAEDecode", "inputs": {"samples": ["10", 0], "vae": ["4", 2]}}
    workflow["12"] = {
        "class_type": "SaveImage",
        "inputs": {"filename_prefix": "late", "images": ["11", 0]},
    }
    job = JobWork("a", 1, ("j",), payload={"workflow": workflow})

    def interrupt_in_second_sampler(update: Update, stop: StopSignal) -> None:
        if isinstance(update, Progress) and update.message.startswith("node 10:"):
            stop.request(StopReason.INTERRUPT, 5.0)

    terminal = run_against(job, interrupt_in_second_sampler)[-1]
    assert isinstance(terminal, Finished)
    assert terminal.interrupted
    assert [r.name for r in terminal.results] == ["ComfyUI_00001_.png", OUTPUTS_MANIFEST]


def video_workflow() -> dict[str, Any]:
    """txt2img saving the picture and, through VideoHelperSuite's node, an animation of it."""
    workflow = txt2img_workflow("a loop", steps=2, size=32)
    workflow["10"] = {
        "class_type": "VHS_VideoCombine",
        "inputs": {
            "images": ["8", 0],
            "frame_rate": 8.0,
            "filename_prefix": "clip",
            "format": "image/gif",
        },
    }
    return workflow


def test_every_file_an_output_node_saved_comes_back_whatever_its_kind() -> None:
    job = JobWork("a", 1, ("j",), payload={"workflow": video_workflow()})
    terminal = run_against(job)[-1]
    assert isinstance(terminal, Finished)
    by_name = {r.name: r for r in terminal.results}
    assert sorted(by_name) == [
        "ComfyUI_00001_.png",
        "clip_00001.gif",
        OUTPUTS_MANIFEST,
    ]  # images, and gifs
    clip = by_name["clip_00001.gif"]
    assert clip.mime == "image/gif"
    assert clip.path is None  # no results folder: held in memory, as before
    assert Image.open(io.BytesIO(clip.data)).n_frames == 2


def test_with_a_results_folder_each_output_is_streamed_into_a_file_there(tmp_path: Path) -> None:
    payload = {"workflow": video_workflow()}
    job = JobWork("a", 1, ("j",), payload=payload, results_root=tmp_path)
    terminal = run_against(job)[-1]
    assert isinstance(terminal, Finished)
    assert len(terminal.results) == 3  # two files and the manifest, which is sent inline
    for result in terminal.results[:2]:
        assert result.data == b""  # nothing in memory: sent from its file
        assert result.path is not None
        assert result.path.parent == job.scratch_dir
        assert result.size == result.path.stat().st_size > 0
    gif = next(r for r in terminal.results if r.name == "clip_00001.gif")
    assert gif.mime == "image/gif"
    assert gif.path is not None
    with Image.open(gif.path) as animation:
        assert animation.n_frames == 2


def test_outputs_sharing_a_file_name_get_distinct_names_and_previews_are_not_results() -> None:
    image = {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1,
                                                     "color": 0}}  # fmt: skip

    def save(prefix: str) -> dict[str, Any]:
        return {
            "class_type": "SaveImage",
            "inputs": {"images": ["1", 0], "filename_prefix": prefix},
        }

    graph = {
        "1": image,
        "2": save("a"),
        "3": save("sub/a"),  # the same file name, in a subfolder
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},  # a temp file
    }
    job = JobWork("al-same", 1, ("job-same",), payload={"workflow": graph})
    terminal = run_against(job)[-1]
    assert isinstance(terminal, Finished), terminal
    images = sorted(r.name for r in terminal.results if r.name.endswith(".png"))
    assert images == ["a_00001_-2.png", "a_00001_.png"]


def test_backend_down_is_a_retryable_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    harness = Harness(ComfyUIExecutor(url, WallClock()), WallClock(), make)
    terminal = asyncio.run(run_to_end(harness, make("quick", "a")))[-1]
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert f"comfyui backend at {url} is unreachable" in terminal.error


def test_a_slow_answer_is_a_retryable_timeout() -> None:
    async def scenario() -> Update:
        server = ReferenceComfyUI()
        server.slow_calls_s = 1.0
        async with serving(server.app) as url:
            executor = ComfyUIExecutor(url, WallClock(), request_timeout_s=0.2)
            return (await run_to_end(Harness(executor, WallClock(), make), make("quick", "a")))[-1]

    terminal = asyncio.run(scenario())
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert "did not answer in time (ReadTimeout)" in terminal.error


def test_a_workflow_is_required() -> None:
    harness = Harness(ComfyUIExecutor("http://127.0.0.1:9", WallClock()), WallClock(), make)
    terminal = asyncio.run(run_to_end(harness, JobWork("a", 1, ("j",), payload={})))[-1]
    assert isinstance(terminal, Failed)
    assert terminal.error.startswith("payload.workflow: must be a ComfyUI workflow")


def test_reference_server_speaks_comfyuis_protocol() -> None:
    """The reference itself: client-chosen prompt_id, message order, history, object_info."""

    async def scenario() -> tuple[list[str], dict[str, Any], dict[str, Any], dict[str, Any]]:
        server = ReferenceComfyUI()
        async with serving(server.app) as url, httpx.AsyncClient(base_url=url) as client:
            async with connect(url.replace("http", "ws") + "/ws?clientId=me") as ws:
                body = {
                    "prompt": txt2img_workflow("x", steps=2),
                    "client_id": "me",
                    "prompt_id": "mine",
                }
                answer = (await client.post("/prompt", json=body)).json()
                kinds = []
                while True:
                    message = json.loads(await ws.recv())
                    kinds.append(message["type"])
                    if message["type"] == "executing" and message["data"]["node"] is None:
                        break
            history = (await client.get("/history/mine")).json()
            info = (await client.get("/object_info")).json()
            return kinds, answer, history, info

    kinds, answer, history, info = asyncio.run(scenario())
    assert answer == {"prompt_id": "mine", "number": 1, "node_errors": {}}
    assert kinds[0] == "status"
    assert kinds[1:3] == ["execution_start", "execution_cached"]
    assert kinds.count("progress") == 2
    assert kinds[-3:] == ["executed", "execution_success", "executing"]
    assert history["mine"]["status"]["status_str"] == "success"
    assert history["mine"]["outputs"]["9"]["images"][0]["type"] == "output"
    assert info["KSampler"]["input"]["required"]["sampler_name"][0][0] == "euler"
