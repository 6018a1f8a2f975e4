"""Input images on ComfyUI: the reference ComfyUI's uploads and model-free image nodes as
ComfyUI has them, and the ComfyUI executor handing a job's input files to it."""

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

from corral.agent.executors.base import Failed, Finished, InputPath, JobWork
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.reference.comfyui import ReferenceComfyUI
from corral.agent.reference.serve import serving
from corral.agent.testing import Harness, run_to_end
from corral.core import WallClock

pytestmark = pytest.mark.timeout(60)


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The test body, run in an event loop of its own."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def harness(client: httpx.AsyncClient, job: JobWork) -> Harness:
    executor = ComfyUIExecutor(str(client.base_url), WallClock(), reconcile_interval_s=0.05)
    return Harness(executor, WallClock(), lambda scenario, alloc: job)


def png(color: tuple[int, ...], size: tuple[int, int] = (32, 16), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return buffer.getvalue()


@asynccontextmanager
async def comfy() -> AsyncIterator[tuple[ReferenceComfyUI, httpx.AsyncClient]]:
    server = ReferenceComfyUI()
    async with serving(server.app) as url, httpx.AsyncClient(base_url=url) as client:
        yield server, client


async def upload(client: httpx.AsyncClient, name: str, data: bytes, **form: str) -> Any:
    response = await client.post("/upload/image", files={"image": (name, data)}, data=form)
    assert response.status_code == 200, response.text
    return response.json()


def edit_graph(image: str, *, blur: bool = True) -> dict[str, Any]:
    """LoadImage -> ImageInvert -> ImageScale (-> ImageBlur) -> SaveImage, and a preview."""
    graph: dict[str, Any] = {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {
            "class_type": "ImageScale",
            "inputs": {
                "image": ["2", 0],
                "upscale_method": "nearest-exact",
                "width": 8,
                "height": 0,
                "crop": "disabled",
            },
        },
        "5": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "e"}},
        "6": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }
    if blur:
        graph["4"] = {
            "class_type": "ImageBlur",
            "inputs": {"image": ["3", 0], "blur_radius": 1, "sigma": 0.5},
        }
        graph["5"]["inputs"]["images"] = ["4", 0]
    return graph


async def run(client: httpx.AsyncClient, graph: dict[str, Any]) -> dict[str, Any]:
    answer = (await client.post("/prompt", json={"prompt": graph})).json()
    prompt_id = answer["prompt_id"]
    for _ in range(500):
        history = (await client.get(f"/history/{prompt_id}")).json()
        if history:
            entry: dict[str, Any] = history[prompt_id]
            return entry
        await asyncio.sleep(0.02)
    raise AssertionError("the prompt never ended")


@in_loop
async def test_uploads_are_named_as_comfyui_names_them() -> None:
    async with comfy() as (server, client):
        red, blue = png((255, 0, 0)), png((0, 0, 255))
        first = await upload(client, "photo.png", red)
        assert first == {"name": "photo.png", "subfolder": "", "type": "input"}
        assert await upload(client, "photo.png", red) == first  # the same bytes: no copy
        clash = await upload(client, "photo.png", blue)
        assert clash["name"] == "photo (1).png"
        assert (await upload(client, "photo.png", blue, overwrite="true"))["name"] == "photo.png"
        assert (server.folders.input / "photo.png").read_bytes() == blue
        temp = await upload(client, "p.png", red, type="temp", subfolder="corral")
        assert temp == {"name": "p.png", "subfolder": "corral", "type": "temp"}
        view = await client.get(
            "/view", params={"filename": "p.png", "subfolder": "corral", "type": "temp"}
        )
        assert view.content == red
        escape = await client.post(
            "/upload/image", files={"image": ("x.png", red)}, data={"subfolder": "../.."}
        )
        assert escape.status_code == 400
        info = (await client.get("/object_info")).json()
        assert info["LoadImage"]["input"]["required"]["image"] == [
            ["photo (1).png", "photo.png"],
            {"image_upload": True},
        ]


@in_loop
async def test_a_mask_upload_puts_its_alpha_into_the_original() -> None:
    async with comfy() as (server, client):
        await upload(client, "face.png", png((10, 200, 30)))
        mask = png((0, 0, 0, 77), mode="RGBA")
        ref = json.dumps({"filename": "face.png", "subfolder": "", "type": "input"})
        response = await client.post(
            "/upload/mask",
            files={"image": ("face-mask.png", mask)},
            data={"original_ref": ref, "type": "input"},
        )
        assert response.json() == {"name": "face-mask.png", "subfolder": "", "type": "input"}
        with Image.open(server.folders.input / "face-mask.png") as saved:
            assert saved.mode == "RGBA"
            assert saved.getpixel((0, 0)) == (10, 200, 30, 77)


@in_loop
async def test_an_uploaded_image_runs_through_the_image_nodes() -> None:
    async with comfy() as (_server, client):
        await upload(client, "in.png", png((200, 100, 0)), subfolder="mine")
        entry = await run(client, edit_graph("mine/in.png"))
        assert entry["status"]["status_str"] == "success", entry["status"]
        saved = entry["outputs"]["5"]["images"][0]
        assert saved["type"] == "output"
        preview = entry["outputs"]["6"]["images"][0]
        assert preview["type"] == "temp"
        assert preview["filename"].startswith("ComfyUI_temp_")
        data = (await client.get("/view", params=saved)).content
        with Image.open(io.BytesIO(data)) as out:
            assert out.size == (8, 4)  # width 8, height kept in proportion
            assert out.convert("RGB").getpixel((4, 2)) == (55, 155, 255)  # inverted


@in_loop
async def test_a_missing_image_fails_validation_as_comfyui_says() -> None:
    async with comfy() as (_, client):
        response = await client.post("/prompt", json={"prompt": edit_graph("nope.png")})
        assert response.status_code == 400
        errors = response.json()["node_errors"]["1"]["errors"]
        assert errors == [
            {
                "type": "custom_validation_failed",
                "message": "Custom validation failed for node",
                "details": "image - Invalid image file: nope.png",
                "extra_info": {"input_name": "image"},
            }
        ]
        mask = {
            "1": {"class_type": "LoadImageMask", "inputs": {"image": "nope.png", "channel": "red"}},
            "2": {
                "class_type": "EmptyImage",
                "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": 0},
            },
            "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
            "4": {
                "class_type": "SaveImage",
                "inputs": {"images": ["2", 0], "filename_prefix": "m"},
            },
        }
        mask["4"]["inputs"]["images"] = ["2", 0]
        answer = await client.post("/prompt", json={"prompt": mask})
        assert answer.status_code == 200  # LoadImageMask feeds no output: never validated


@in_loop
async def test_empty_image_makes_a_batch_of_one_colour() -> None:
    async with comfy() as (_, client):
        graph = {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 6, "height": 5, "batch_size": 2, "color": 0x102030},
            },
            "2": {
                "class_type": "SaveImage",
                "inputs": {"images": ["1", 0], "filename_prefix": "empty"},
            },
        }
        entry = await run(client, graph)
        files = entry["outputs"]["2"]["images"]
        assert [f["filename"] for f in files] == ["empty_00001_.png", "empty_00002_.png"]
        data = (await client.get("/view", params=files[1])).content
        with Image.open(io.BytesIO(data)) as out:
            assert out.size == (6, 5)
            assert out.getpixel((0, 0)) == (0x10, 0x20, 0x30)


@in_loop
async def test_the_executor_uploads_a_jobs_input_files_and_points_the_graph_at_them(
    tmp_path: Path,
) -> None:
    source = tmp_path / "photo.png"
    source.write_bytes(png((0, 0, 0)))
    async with comfy() as (server, client):
        job = JobWork(
            "al-1",
            1,
            ("job-1",),
            payload={"workflow": edit_graph("photo.png", blur=False)},
            inputs=(InputPath("photo.png", "0" * 64, source),),
        )
        updates = await run_to_end(harness(client, job), job)
        end = updates[-1]
        assert isinstance(end, Finished), end
        image = next(r for r in end.results if r.name.endswith(".png"))
        with Image.open(io.BytesIO(image.data or b"")) as out:
            assert out.convert("RGB").getpixel((0, 0)) == (255, 255, 255)
        uploaded = list((server.folders.temp / "corral").iterdir())
        assert [p.name for p in uploaded] == ["job-1-0.png"]  # in ComfyUI's temp folder
        assert not (server.folders.input / "photo.png").exists()


@in_loop
async def test_an_input_file_the_graph_does_not_name_leaves_it_failing_clearly(
    tmp_path: Path,
) -> None:
    async with comfy() as (_, client):
        job = JobWork("al-2", 1, ("job-2",), payload={"workflow": edit_graph("other.png")})
        end = (await run_to_end(harness(client, job), job))[-1]
        assert isinstance(end, Failed)
        assert not end.retryable
        assert "Invalid image file: other.png" in end.error
