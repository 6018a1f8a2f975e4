"""Where the real ComfyUI is less kind than a happy path: dropped outputs, refusals with
reasons, cached results (whose files may be gone) and outputs of every kind.

Each runs the ComfyUI executor against the reference ComfyUI over real HTTP and
websockets; the reference mirrors the real server's behaviour in each case.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from corral.agent.executors.base import Failed, Finished, JobWork, LogLine, Progress, Update
from corral.agent.executors.comfyui_outputs import OUTPUTS_MANIFEST
from corral.agent.executors.http_comfyui import ComfyUIExecutor
from corral.agent.reference.comfyui import (
    ReferenceComfyUI,
    two_branch_workflow,
    txt2img_workflow,
)
from corral.agent.reference.serve import serving
from corral.agent.testing import Harness, run_to_end
from corral.core import WallClock


def make(scenario: str, alloc: str) -> JobWork:
    raise AssertionError("these tests make their own assignments")


def jobs(*workflows: dict[str, Any], server: ReferenceComfyUI | None = None) -> list[list[Update]]:
    """Run each workflow in turn as a job on one reference server; every job's updates."""

    async def scenario() -> list[list[Update]]:
        reference = server or ReferenceComfyUI()
        async with serving(reference.app) as url:
            harness = Harness(ComfyUIExecutor(url, WallClock()), WallClock(), make)
            runs = []
            for i, workflow in enumerate(workflows):
                job = JobWork(f"a{i}", 1, (f"j{i}",), payload={"workflow": workflow})
                runs.append(await run_to_end(harness, job))
            return runs

    return asyncio.run(scenario())


def post_prompt(prompt: dict[str, Any]) -> tuple[int, dict[str, Any], ReferenceComfyUI]:
    async def scenario() -> tuple[int, dict[str, Any]]:
        async with serving(server.app) as url, httpx.AsyncClient(base_url=url) as client:
            answer = await client.post("/prompt", json={"prompt": prompt, "prompt_id": "p"})
            for _ in range(200):  # a valid prompt runs: wait for its history
                if answer.status_code != 200 or (await client.get("/history/p")).json():
                    break
                await asyncio.sleep(0.02)
            return answer.status_code, answer.json()

    server = ReferenceComfyUI()
    status, body = asyncio.run(scenario())
    return status, body, server


# ---- item 1: outputs dropped by validation -------------------------------------


def test_the_reference_runs_the_valid_outputs_and_names_the_dropped_ones() -> None:
    """ComfyUI's ``validate_prompt``: 200, the bad branch's errors in ``node_errors``."""
    status, body, server = post_prompt(two_branch_workflow("two", width=0))
    assert status == 200
    assert body["node_errors"] == {
        "13": {
            "errors": [
                {
                    "type": "value_smaller_than_min",
                    "message": "Value 0 smaller than min of 16",
                    "details": "width",
                    "extra_info": {
                        "input_name": "width",
                        "input_config": [
                            "INT",
                            {"default": 512, "min": 16, "max": 16384, "step": 8},
                        ],
                        "received_value": 0,
                    },
                }
            ],
            "dependent_outputs": ["12"],
            "class_type": "EmptyLatentImage",
        }
    }
    entry = server.history["p"]
    assert entry["prompt"][4] == ["9"]  # the outputs it executes
    assert list(entry["outputs"]) == ["9"]


def test_a_job_never_succeeds_while_comfyui_dropped_an_output() -> None:
    [updates] = jobs(two_branch_workflow("two", width=0))
    terminal = updates[-1]
    assert isinstance(terminal, Failed)
    assert not terminal.retryable
    assert terminal.error == (
        "comfyui dropped output nodes #12 of the prompt (they failed validation; corral runs"
        " a graph whole or not at all): node #13 (EmptyLatentImage) input width:"
        " Value 0 smaller than min of 16"
    )


# ---- item 2: refusals carry ComfyUI's reasons ----------------------------------


def test_a_refused_graph_fails_with_each_nodes_reason() -> None:
    graph = txt2img_workflow("x", steps=20_000)
    graph["3"]["inputs"]["sampler_name"] = "plms"
    del graph["5"]["inputs"]["batch_size"]
    status, body, _ = post_prompt(graph)
    assert status == 400
    assert body["error"] == {
        "type": "prompt_outputs_failed_validation",
        "message": "Prompt outputs failed validation",
        "details": "",
        "extra_info": {},
    }
    errors = {
        (node, e["type"], e["message"], e["details"])
        for node, entry in body["node_errors"].items()
        for e in entry["errors"]
    }
    assert errors == {
        ("3", "value_bigger_than_max", "Value 20000 bigger than max of 10000", "steps"),
        (
            "3",
            "value_not_in_list",
            "Value not in list",
            "sampler_name: 'plms' not in ['euler', 'euler_ancestral', 'dpmpp_2m', 'ddim']",
        ),
        ("5", "required_input_missing", "Required input is missing", "batch_size"),
    }
    [updates] = jobs(graph)
    terminal = updates[-1]
    assert isinstance(terminal, Failed)
    assert terminal.error.startswith("comfyui refused the prompt: Prompt outputs failed validation")
    assert "node #3 (KSampler) input steps: Value 20000 bigger than max of 10000" in terminal.error
    assert "node #5 (EmptyLatentImage) input batch_size: Required input is missing" in (
        terminal.error
    )


# ---- item 3: cached results -----------------------------------------------------


def test_a_graph_run_again_is_answered_from_the_cache() -> None:
    first, again = jobs(txt2img_workflow("same", steps=3), txt2img_workflow("same", steps=3))
    assert isinstance(first[-1], Finished)
    assert isinstance(again[-1], Finished)
    assert [u.fraction for u in again if isinstance(u, Progress)] == [1.0]  # nothing ran
    names = [[r.name for r in first[-1].results], [r.name for r in again[-1].results]]
    assert names[0] == names[1] == ["ComfyUI_00001_.png", OUTPUTS_MANIFEST]


def test_a_cached_result_whose_file_is_gone_is_run_again() -> None:
    server = ReferenceComfyUI()
    workflow = txt2img_workflow("same", steps=3)

    async def scenario() -> list[Update]:
        async with serving(server.app) as url:
            harness = Harness(ComfyUIExecutor(url, WallClock()), WallClock(), make)
            job = JobWork("a", 1, ("j",), payload={"workflow": workflow})
            assert isinstance((await run_to_end(harness, job))[-1], Finished)
            for path in server.output_dir.glob("*.png"):
                path.unlink()  # someone cleaned ComfyUI's output folder
            return await run_to_end(harness, JobWork("b", 1, ("k",), payload=job.payload))

    updates = asyncio.run(scenario())
    terminal = updates[-1]
    assert isinstance(terminal, Finished), terminal
    # saved again (ComfyUI numbers past the files in the folder: none are left)
    assert [r.name for r in terminal.results] == ["ComfyUI_00001_.png", OUTPUTS_MANIFEST]
    assert (server.output_dir / "ComfyUI_00001_.png").is_file()
    assert any(
        isinstance(u, LogLine) and "running those output nodes again" in u.line for u in updates
    )
    assert not any(isinstance(u, Progress) and u.fraction < 1 for u in updates)  # no resample


# ---- item 4: every output keeps its kind, node and subfolder --------------------


def test_a_saved_latent_keeps_its_kind_and_subfolder() -> None:
    graph = txt2img_workflow("latent", steps=2)
    graph["20"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["3", 0], "filename_prefix": "latents/ComfyUI"},
    }
    [updates] = jobs(graph)
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    by_name = {r.name: r for r in terminal.results}
    assert sorted(by_name) == ["ComfyUI_00001_.latent", "ComfyUI_00001_.png", OUTPUTS_MANIFEST]
    manifest = json.loads(by_name[OUTPUTS_MANIFEST].data)
    assert manifest["outputs"]["20"] == {
        "latents": [
            {
                "filename": "ComfyUI_00001_.latent",
                "subfolder": "latents",
                "type": "output",
                "result": "ComfyUI_00001_.latent",
            }
        ]
    }
    assert manifest["outputs"]["9"]["images"][0]["result"] == "ComfyUI_00001_.png"
