"""A ComfyUI sample survives its machine: real server, two agents on reference ComfyUIs.

The job's sampler runs in segments whose latents are uploaded as checkpoints;
the first agent is killed with ``kill -9`` mid-sampling; the job resumes on the
second from the last segment's latent, runs only the steps left, and its image
is the one an uninterrupted run of the same graph gives.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from e2e_harness import Cluster, events, eventually, job, submit, wait_state
from PIL import Image

from corral.agent.reference.comfyui import ReferenceComfyUI, txt2img_workflow
from corral.agent.reference.serve import serving_in_thread

pytestmark = pytest.mark.slow

STEPS = 40


@contextmanager
def backend(server: Any) -> Iterator[str]:
    """Serve ``server`` (a reference ComfyUI or webui) from a thread of this process."""
    with serving_in_thread(server.app) as url:
        yield url


def pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB").tobytes()


def uninterrupted(url: str, graph: dict[str, Any]) -> bytes:
    """The graph's image, run straight through on a ComfyUI."""
    with httpx.Client(base_url=url, timeout=10) as comfy:
        prompt_id = comfy.post("/prompt", json={"prompt": graph}).json()["prompt_id"]
        entry = eventually(
            lambda: comfy.get(f"/history/{prompt_id}").json().get(prompt_id), 60, "the run"
        )
        ref = entry["outputs"]["9"]["images"][0]
        return pixels(comfy.get("/view", params=ref).content)


def test_a_sample_whose_machine_is_killed_resumes_from_its_last_segment_elsewhere(
    cluster: Cluster,
) -> None:
    graph = txt2img_workflow("a lighthouse at dusk", steps=STEPS, seed=11, size=64)
    first, second = ReferenceComfyUI(step_delay_s=0.1), ReferenceComfyUI(step_delay_s=0.02)
    with backend(first) as url_a, backend(second) as url_b:
        cluster.start_server(node_timeout=2.0)
        box_a = cluster.start_agent("box-a", "--comfyui", url_a, "--cpus", "1")
        with cluster.client() as c:
            j = submit(
                c,
                kind="sample",
                backend="comfyui",
                payload={"workflow": graph, "checkpoint_steps": 5},
                resources={"gpus": 0, "cpus": 1},
                max_attempts=3,
            )
            saved = eventually(
                lambda: (job(c, j["id"]).get("checkpoint_step") or 0) >= 10 and job(c, j["id"]),
                60,
                "a sampling checkpoint at step 10 or later",
            )
            assert saved["checkpoint"].startswith("blob:")
            box_a.kill9()
            cluster.start_agent("box-b", "--comfyui", url_b, "--cpus", "1")
            done = wait_state(c, j["id"], "succeeded", timeout=60)
            assert done["attempt"] == 2
            assert done["resumed_from_step"] >= saved["checkpoint_step"]
            assert [a["node"] for a in done["attempts"]] == ["box-a"]
            images = [r["name"] for r in done["result"] if r["name"].endswith(".png")]
            assert len(images) == 1, done["result"]
            image = c.get(f"/v1/jobs/{j['id']}/result/{images[0]}").content
            step = done["resumed_from_step"]
            stream = [f["data"] for f in events(c, j["id"])]
            placed = [e for e in stream if e["kind"] == "job.placed"]
            assert placed[-1]["data"]["message"] == f"resumed from step {step} on node box-b"
            after = stream[stream.index(placed[-1]) :]
            shown = [e["data"]["progress"] for e in after if e["kind"] == "job.progress"]
            assert shown[0] == step / STEPS, "the bar goes on from the checkpoint, not from 0"
            assert shown == sorted(shown)
        (entry,) = second.history.values()  # the one prompt the second machine ran
        resumed = entry["prompt"][2]
        loads = [n for n in resumed.values() if n["class_type"] == "LoadLatent"]
        assert len(loads) == 1, "the second machine loaded the checkpoint's latent"
        starts = [
            n["inputs"]["start_at_step"]
            for n in resumed.values()
            if n["class_type"] == "KSamplerAdvanced"
        ]
        assert min(starts) == done["resumed_from_step"], "it sampled only the steps left"
        assert pixels(image) == uninterrupted(url_b, graph)
