"""The rest of ComfyUI's API on corral (what clients and ComfyUI's frontend call besides
``/prompt``), against real processes: server, agent, reference ComfyUI. Each answer is
checked against the shape and status code ComfyUI's own ``server.py`` gives."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from compat_harness import CompatCluster, compat_cluster
from e2e_harness import ADMIN, eventually
from PIL import Image

from corral.agent.reference.comfyui import txt2img_workflow

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CompatCluster]:
    yield from compat_cluster(Path(tmp_path_factory.mktemp("compat-comfyui-cluster")))


@pytest.fixture
def comfy(corral: CompatCluster) -> Iterator[httpx.Client]:
    """A client of the drop-in ComfyUI API as user ``cleo`` (HTTP Basic, a corral token)."""
    with httpx.Client(base_url=corral.http, auth=("cleo", ADMIN), timeout=30) as client:
        yield client


def run(comfy: httpx.Client, steps: int = 2, prefix: str = "") -> str:
    """Queue a small txt2img prompt and wait for its history entry; its prompt_id."""
    prompt_id = str(uuid.uuid4())
    answer = comfy.post(
        f"{prefix}/prompt",
        json={"prompt": txt2img_workflow("x", steps=steps, size=32), "prompt_id": prompt_id},
    )
    assert answer.status_code == 200, answer.text
    eventually(lambda: comfy.get(f"/history/{prompt_id}").json(), 60, "the prompt in /history")
    return prompt_id


def test_object_info_one_class_and_the_api_prefix(comfy: httpx.Client) -> None:
    info = comfy.get("/object_info").json()
    assert {"KSampler", "CheckpointLoaderSimple", "SaveImage"} <= set(info)
    assert comfy.get("/api/object_info").json() == info  # ComfyUI's /api aliases
    one = comfy.get("/object_info/KSampler")
    assert one.status_code == 200
    assert one.json() == {"KSampler": info["KSampler"]}
    assert comfy.get("/object_info/NoSuchNode").json() == {}  # ComfyUI: 200 {}


def test_models_embeddings_and_system_stats(comfy: httpx.Client) -> None:
    folders = comfy.get("/models").json()
    assert {"checkpoints", "loras", "vae", "embeddings"} <= set(folders)
    assert comfy.get("/models/checkpoints").json() == ["tiny-v2.safetensors", "tiny.safetensors"]
    assert comfy.get("/models/loras").json() == ["tiny-lora.safetensors"]  # its LoraLoader's
    missing = comfy.get("/models/no-such-folder")
    assert (missing.status_code, missing.content) == (404, b"")  # ComfyUI: 404, no body
    assert comfy.get("/embeddings").json() == []
    stats = comfy.get("/api/system_stats").json()
    assert {"os", "python_version", "comfyui_version", "ram_total", "argv"} <= set(stats["system"])
    (device,) = stats["devices"]  # the one CPU-only node
    assert (device["name"], device["type"]) == ("box: cpu", "cpu")
    assert set(device) == {
        "name",
        "type",
        "index",
        "vram_total",
        "vram_free",
        "torch_vram_total",
        "torch_vram_free",
    }


def test_history_lists_the_last_prompts_oldest_first_with_comfyuis_keys(
    comfy: httpx.Client,
) -> None:
    first, second = run(comfy), run(comfy, prefix="/api")
    history = comfy.get("/history").json()
    assert list(history)[-2:] == [first, second]
    assert list(comfy.get("/history", params={"max_items": 1}).json()) == [second]
    entry = history[second]
    assert set(entry) == {"prompt", "outputs", "status", "meta"}
    number, prompt_id, graph, extra, outputs = entry["prompt"]
    assert (prompt_id, outputs, graph["3"]["class_type"]) == (second, ["9"], "KSampler")
    assert isinstance(number, int)
    assert isinstance(extra["create_time"], int)
    assert entry["meta"]["9"] == {
        "node_id": "9",
        "display_node": "9",
        "parent_node": None,
        "real_node_id": "9",
    }
    kinds = [kind for kind, _ in entry["status"]["messages"]]
    assert kinds == ["execution_start", "execution_cached", "execution_success"]
    assert comfy.get("/history", params={"max_items": "x"}).status_code == 400


def test_queue_info_clear_and_jobs(comfy: httpx.Client) -> None:
    assert comfy.get("/prompt").json() == {"exec_info": {"queue_remaining": 0}}
    ids = [str(uuid.uuid4()) for _ in range(4)]
    for prompt_id in ids:  # two CPU slots: two run, two wait
        body = {"prompt": txt2img_workflow("slow", steps=400, size=32), "prompt_id": prompt_id}
        assert comfy.post("/prompt", json=body).status_code == 200
    assert comfy.get("/prompt").json() == {"exec_info": {"queue_remaining": 4}}

    def waiting() -> set[str] | None:
        queue = comfy.get("/queue").json()
        shape = (len(queue["queue_running"]), len(queue["queue_pending"]))
        return {item[1] for item in queue["queue_pending"]} if shape == (2, 2) else None

    pending = eventually(waiting, 60, "two running, two waiting")
    listed = comfy.get("/api/jobs", params={"status": "in_progress,pending"}).json()
    assert sorted(j["status"] for j in listed["jobs"]) == ["in_progress"] * 2 + ["pending"] * 2
    assert listed["pagination"] == {"offset": 0, "limit": 200, "total": 4, "has_more": False}
    assert comfy.post("/queue", json={"clear": True}).status_code == 200
    queue = comfy.get("/queue").json()
    assert (len(queue["queue_running"]), queue["queue_pending"]) == (2, [])
    assert comfy.post("/interrupt", json={}).status_code == 200
    eventually(lambda: comfy.get("/prompt").json()["exec_info"]["queue_remaining"] == 0, 60)
    ended = comfy.get("/jobs", params={"status": "cancelled", "limit": 10}).json()["jobs"]
    assert pending <= {j["id"] for j in ended}  # cleared while they waited
    assert comfy.get("/jobs", params={"status": "bogus"}).status_code == 400


def test_view_types_previews_and_channels(comfy: httpx.Client) -> None:
    prompt_id = run(comfy)
    (image,) = comfy.get(f"/history/{prompt_id}").json()[prompt_id]["outputs"]["9"]["images"]
    where = {"filename": image["filename"], "subfolder": image["subfolder"]}
    png = comfy.get("/view", params={**where, "type": "output"})
    assert png.headers["content-type"] == "image/png"
    webp = comfy.get("/api/view", params={**where, "preview": "webp;50"})
    assert webp.headers["content-type"] == "image/webp"
    assert Image.open(io.BytesIO(webp.content)).size == (32, 32)
    jpeg = comfy.get("/view", params={**where, "preview": "jpeg;80"})
    assert Image.open(io.BytesIO(jpeg.content)).format == "JPEG"
    alpha = comfy.get("/view", params={**where, "channel": "a"})
    assert Image.open(io.BytesIO(alpha.content)).mode == "RGBA"
    rgb = comfy.get("/view", params={**where, "channel": "rgb"})
    assert Image.open(io.BytesIO(rgb.content)).mode == "RGB"
    statuses: dict[str, Any] = {
        "temp": comfy.get("/view", params={**where, "type": "temp"}).status_code,
        "bogus": comfy.get("/view", params={**where, "type": "bogus"}).status_code,
        "dotdot": comfy.get("/view", params={"filename": "../x.png"}).status_code,
        "absent": comfy.get("/view", params={**where, "filename": "nope.png"}).status_code,
    }
    assert statuses == {"temp": 404, "bogus": 400, "dotdot": 400, "absent": 404}


def test_free_is_accepted_and_another_sites_page_may_not_use_basic_credentials(
    comfy: httpx.Client, corral: CompatCluster
) -> None:
    assert comfy.post("/free", json={"unload_models": True}).status_code == 200
    foreign = comfy.get("/queue", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403
    assert foreign.json()["error"]["type"] == "forbidden"
    own = comfy.get("/queue", headers={"Origin": corral.http})
    assert own.status_code == 200
    bearer = httpx.get(
        f"{corral.http}/queue",
        headers={"Authorization": f"Bearer {ADMIN}", "Origin": "https://tool.example"},
    )
    assert bearer.status_code == 200  # a token a script sends itself: no browser ambient
