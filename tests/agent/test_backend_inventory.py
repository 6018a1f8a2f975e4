"""What a node's backends have on disk, and work naming a model a backend lacks.

Against the reference backends over real HTTP: their model lists in the real
servers' shapes (ComfyUI ``/models``, ``/models/{folder}``; the webui's
``/sd-models``, ``/loras``, ``/sd-vae``, ``/embeddings``), the agent's probe of
them, and the executors' retryable failure naming a LoRA, VAE or checkpoint the
backend does not have (ComfyUI refuses it with ``value_not_in_list``; the webui
would run without the LoRA, so the executor checks first).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from corral.agent.backend_models import probe
from corral.agent.executors.base import Failed, Finished, JobWork, Update
from corral.agent.executors.http_a1111 import A1111Executor
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.reference.a1111 import ReferenceA1111
from corral.agent.reference.comfyui import ReferenceComfyUI, txt2img_workflow
from corral.agent.reference.serve import free_port, serving
from corral.agent.testing import Harness, run_to_end
from corral.core import WallClock
from corral.core.model_names import lacked


def make(scenario: str, alloc: str) -> JobWork:
    raise AssertionError("these tests make their own assignments")


def graph_job(alloc: str, **kwargs: Any) -> JobWork:
    workflow = txt2img_workflow("a lighthouse", **{"steps": 2, **kwargs})
    return JobWork(alloc, 1, (f"job-{alloc}",), payload={"workflow": workflow})


def comfy_run(job: JobWork, server: ReferenceComfyUI | None = None) -> Update:
    async def scenario() -> Update:
        reference = server or ReferenceComfyUI()
        async with serving(reference.app) as url:
            harness = Harness(ComfyUIExecutor(url, WallClock()), WallClock(), make)
            return (await run_to_end(harness, job))[-1]

    return asyncio.run(scenario())


def webui_run(payload: dict[str, Any], model: str | None = None) -> Update:
    async def scenario() -> Update:
        async with serving(ReferenceA1111().app) as url:
            harness = Harness(A1111Executor(url, WallClock()), WallClock(), make)
            job = JobWork("a", 1, ("job-a",), kind="sample", payload=payload, model=model)
            return (await run_to_end(harness, job))[-1]

    return asyncio.run(scenario())


def test_comfyui_lists_its_model_folders_and_their_files_as_the_real_one_does() -> None:
    async def scenario() -> tuple[list[httpx.Response], dict[str, Any]]:
        server = ReferenceComfyUI(loras=("detail.safetensors", "sd15/style.safetensors"))
        async with serving(server.app) as url, httpx.AsyncClient(base_url=url) as client:
            paths = ("/models", "/models/checkpoints", "/models/loras", "/models/vae")
            answers = [await client.get(p) for p in (*paths, "/models/nonsense")]
            info = (await client.get("/object_info")).json()
        return answers, info

    (folders, ckpts, loras, vaes, unknown), info = asyncio.run(scenario())
    assert {"checkpoints", "loras", "vae", "embeddings", "upscale_models"} <= set(folders.json())
    assert ckpts.json() == ["tiny-v2.safetensors", "tiny.safetensors"]  # sorted, as ComfyUI
    assert loras.json() == ["detail.safetensors", "sd15/style.safetensors"]
    assert vaes.json() == ["tiny-vae.safetensors"]
    assert (unknown.status_code, unknown.content) == (404, b"")
    # the loaders offer the same files, as ComfyUI's INPUT_TYPES read the same folders
    assert info["LoraLoader"]["input"]["required"]["lora_name"] == [loras.json()]
    assert info["VAELoader"]["input"]["required"]["vae_name"] == [vaes.json()]


def test_the_webui_lists_its_vaes_and_embeddings_in_its_own_shapes() -> None:
    async def scenario() -> tuple[Any, Any]:
        async with (
            serving(ReferenceA1111().app) as url,
            httpx.AsyncClient(base_url=url) as client,
        ):
            vae = (await client.get("/sdapi/v1/sd-vae")).json()
            embeddings = (await client.get("/sdapi/v1/embeddings")).json()
        return vae, embeddings

    vae, embeddings = asyncio.run(scenario())
    assert vae == [
        {"model_name": "tiny-vae.safetensors", "filename": "/models/VAE/tiny-vae.safetensors"}
    ]
    assert set(embeddings) == {"loaded", "skipped"}
    assert set(embeddings["loaded"]["tiny-embed"]) >= {"step", "shape", "vectors"}


def test_the_probe_reports_every_kind_from_both_backends_prefixed_by_kind() -> None:
    async def scenario() -> Any:
        webui = ReferenceA1111(loras=("add-detail",))
        comfy = ReferenceComfyUI(checkpoints=("x.safetensors",), loras=("y.safetensors",))
        async with serving(webui.app) as a, serving(comfy.app) as c:
            return await probe(a, c)

    found = asyncio.run(scenario())
    assert set(found.on_disk) == {
        "tiny-sd",
        "tiny-sd-v2",
        "lora:add-detail",
        "vae:tiny-vae.safetensors",
        "embedding:tiny-embed",
        "x.safetensors",
        "lora:y.safetensors",
    }
    assert dict(found.loaded) == {"a1111": ("tiny-sd",)}


def test_a_backend_that_does_not_answer_is_left_out_and_the_other_still_counts() -> None:
    async def scenario() -> Any:
        comfy = ReferenceComfyUI(checkpoints=("x.safetensors",), loras=())
        async with serving(comfy.app) as c:
            return await probe(f"http://127.0.0.1:{free_port()}", c, timeout_s=2.0)

    found = asyncio.run(scenario())
    assert set(found.on_disk) == {"x.safetensors", "vae:tiny-vae.safetensors"}


def test_comfyui_refusing_a_lora_it_lacks_is_retryable_and_names_it() -> None:
    terminal = comfy_run(graph_job("a", lora="elsewhere.safetensors"))
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert lacked(terminal.error) == ("lora:elsewhere.safetensors",)
    assert "lora_name: 'elsewhere.safetensors' not in" in terminal.error  # ComfyUI's reason


def test_every_missing_file_of_the_graph_is_named() -> None:
    terminal = comfy_run(graph_job("a", ckpt="big.safetensors", vae="v.safetensors"))
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert lacked(terminal.error) == ("big.safetensors", "vae:v.safetensors")


def test_a_graph_wrong_on_every_node_too_is_not_retried() -> None:
    terminal = comfy_run(graph_job("a", lora="elsewhere.safetensors", steps=0))
    assert isinstance(terminal, Failed)
    assert not terminal.retryable
    assert lacked(terminal.error) == ()


def test_a_graph_with_the_files_the_backend_has_runs() -> None:
    server = ReferenceComfyUI(loras=("detail.safetensors",), vaes=("v.safetensors",))
    terminal = comfy_run(graph_job("a", lora="detail.safetensors", vae="v.safetensors"), server)
    assert isinstance(terminal, Finished), terminal


def test_the_webui_executor_refuses_a_lora_its_webui_lacks_before_running() -> None:
    terminal = webui_run({"prompt": "a cat <lora:elsewhere:0.8>", "steps": 2})
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert lacked(terminal.error) == ("lora:elsewhere",)
    ran = webui_run({"prompt": "a cat <lora:tiny-detail:0.8>", "steps": 2, "width": 64})
    assert isinstance(ran, Finished), ran


def test_the_webui_executor_names_a_checkpoint_its_webui_lacks() -> None:
    terminal = webui_run({"prompt": "a cat", "steps": 2}, model="sdxl-turbo")
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert lacked(terminal.error) == ("sdxl-turbo",)
