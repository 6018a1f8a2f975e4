"""The HTTP executors swap the backend's checkpoint to a model from the agent's cache, and say
what is loaded: AUTOMATIC1111 (link + refresh-checkpoints + options) and ComfyUI (link +
the workflow's loader), against the reference backends over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.agent.executors.base import Failed, Finished, JobWork, LogLine, StopSignal, Update
from corral.agent.executors.http_a1111 import A1111Executor
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.executors.model_files import file_stem, install
from corral.agent.reference.a1111 import ReferenceA1111
from corral.agent.reference.comfyui import ReferenceComfyUI, txt2img_workflow
from corral.agent.reference.serve import serving
from corral.core import WallClock

SMALL = {"prompt": "a red fox", "steps": 2, "seed": 7, "width": 32, "height": 32}


async def run(executor: A1111Executor | ComfyUIExecutor, job: JobWork) -> list[Update]:
    return [u async for u in executor.run(job, StopSignal())]


def cached_file(tmp_path: Path) -> Path:
    blob = tmp_path / "cache" / "blobs" / ("ab" * 32)  # where the agent's cache keeps it
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"weights")
    return blob


def test_a1111_links_the_cached_model_rescans_and_switches_to_it(tmp_path: Path) -> None:
    folder = tmp_path / "Stable-diffusion"
    blob = cached_file(tmp_path)

    async def scenario() -> None:
        server = ReferenceA1111(models_dir=folder)
        async with serving(server.app) as url:
            a1111 = A1111Executor(url, WallClock(), poll_interval_s=0.02, models_dir=folder)
            assert a1111.loaded() == ()
            job = JobWork("al", 1, ("j",), payload=SMALL, model="org/dreambooth",
                             model_path=blob)  # fmt: skip
            updates = await run(a1111, job)
            assert isinstance(updates[-1], Finished), updates[-1]
            switched = [u.line for u in updates if isinstance(u, LogLine)]
            assert len(switched) == 1
            assert " to org--dreambooth.safetensors [" in switched[0]
            assert server.loaded == "org--dreambooth"
            assert a1111.loaded() == ("org/dreambooth",)
            again = await run(a1111, job)  # already loaded: no second switch
            assert not [u for u in again if isinstance(u, LogLine)]

    asyncio.run(scenario())
    link = folder / "org--dreambooth.safetensors"
    assert link.is_symlink()
    assert link.resolve() == blob.resolve()


def test_a1111_without_a_models_folder_asks_for_the_name_and_fails_retryably(
    tmp_path: Path,
) -> None:
    async def scenario() -> Update:
        server = ReferenceA1111()
        async with serving(server.app) as url:
            a1111 = A1111Executor(url, WallClock(), poll_interval_s=0.02)
            job = JobWork("al", 1, ("j",), payload=SMALL, model="org/dreambooth",
                             model_path=cached_file(tmp_path))  # fmt: skip
            return await run_failing(a1111, job)

    failed = asyncio.run(scenario())
    assert isinstance(failed, Failed)
    assert failed.retryable
    assert "org/dreambooth" in failed.error


def test_comfyui_loads_the_cached_model_through_the_workflow_loader(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    blob = cached_file(tmp_path)

    async def scenario() -> None:
        server = ReferenceComfyUI(models_dir=folder)
        async with serving(server.app) as url:
            comfy = ComfyUIExecutor(url, WallClock(), models_dir=folder)
            payload = {"workflow": txt2img_workflow("a lighthouse", steps=2)}
            job = JobWork("al", 1, ("j",), payload=payload, model="sdxl-base",
                             model_path=blob)  # fmt: skip
            updates = await run(comfy, job)
            assert isinstance(updates[-1], Finished), updates[-1]
            assert "sdxl-base.safetensors" in server.checkpoints
            assert comfy.loaded() == ("sdxl-base",)

    asyncio.run(scenario())
    assert (folder / "sdxl-base.safetensors").resolve() == blob.resolve()


def test_install_replaces_a_stale_link_and_never_a_backend_s_own_file(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(b"v1")
    new.write_bytes(b"v2")
    folder = tmp_path / "models"
    assert install(folder, "m", old) == "m.safetensors"
    assert install(folder, "m", new) == "m.safetensors"
    assert (folder / "m.safetensors").read_bytes() == b"v2"
    (folder / "own.safetensors").write_bytes(b"the backend's")
    install(folder, "own", new)
    assert (folder / "own.safetensors").read_bytes() == b"the backend's"
    assert file_stem("org/sd xl") == "org--sd--xl"


async def run_failing(executor: A1111Executor, job: JobWork) -> Update:
    from corral.agent.executors.runner import execute

    updates = [u async for u in execute(executor, job, StopSignal(), WallClock())]
    return updates[-1]


def test_commands_and_python_handlers_get_the_model_file(tmp_path: Path) -> None:
    from corral.agent.executors.command import job_env
    from corral.agent.executors.python import HandlerContext

    blob = cached_file(tmp_path)
    job = JobWork("al", 1, ("j",), model="sdxl", model_path=blob)
    env = job_env(job, tmp_path / "out", {"CORRAL_MODEL_PATH": "not this"})
    assert (env["CORRAL_MODEL"], env["CORRAL_MODEL_PATH"]) == ("sdxl", str(blob))
    assert HandlerContext(job, StopSignal()).model_path == blob
    assert job_env(JobWork("al", 1, ("j",)), tmp_path / "o", {})["CORRAL_MODEL_PATH"] == ""
