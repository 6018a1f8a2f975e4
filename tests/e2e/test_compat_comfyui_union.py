"""ComfyUI's ``/object_info`` on a cluster is the union of what its nodes offer.

Real processes: ``corral server``, two reference ComfyUIs (one also has
``extra.safetensors`` in its models folder) and two agents, one per ComfyUI. Each
agent reports its ComfyUI's ``/object_info``; the drop-in API lists the node types
and every node's checkpoints, and a graph for the checkpoint only one node has is
accepted.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from compat_harness import reference
from e2e_harness import ADMIN, Cluster, eventually

from corral.agent.reference.comfyui import txt2img_workflow

pytestmark = pytest.mark.timeout(240)


def test_object_info_models_and_prompts_cover_every_node(cluster: Cluster, tmp_path: Path) -> None:
    extra = tmp_path / "checkpoints"
    extra.mkdir()
    (extra / "extra.safetensors").write_bytes(b"not a real model")
    _, plain = reference(cluster, "comfyui")
    _, richer = reference(cluster, "comfyui", "--models-dir", str(extra))
    cluster.start_server()  # compat.gpus unset: one GPU where a ComfyUI node has one
    cluster.start_agent("plain", "--comfyui", plain, "--cpus", "1")
    cluster.start_agent("richer", "--comfyui", richer, "--fake-gpus", "1x RTX 4090 24GiB")

    with httpx.Client(base_url=cluster.http, auth=("dee", ADMIN), timeout=30) as comfy:

        def checkpoints() -> list[str] | None:
            info = comfy.get("/object_info/CheckpointLoaderSimple").json()
            names = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
            return names if "extra.safetensors" in names else None

        names = eventually(checkpoints, 30, "both nodes' checkpoints listed")
        assert sorted(names) == ["extra.safetensors", "tiny-v2.safetensors", "tiny.safetensors"]
        assert comfy.get("/models/checkpoints").json() == sorted(names)
        assert {"KSampler", "SaveImage"} <= set(comfy.get("/object_info").json())
        devices = comfy.get("/system_stats").json()["devices"]
        assert [(d["name"], d["type"]) for d in devices] == [
            ("plain: cpu", "cpu"),
            ("richer: RTX 4090", "cuda"),
        ]
        assert devices[1]["vram_total"] == 24 * 1024**3

        # the graph is checked against every node's lists: a checkpoint one node has passes
        graph = txt2img_workflow("x", steps=2, size=32, ckpt="extra.safetensors")
        answer = comfy.post("/prompt", json={"prompt": graph})
        assert answer.status_code == 200, answer.text
        assert answer.json()["node_errors"] == {}
        graph["4"]["class_type"] = "NoNodeHasThis"
        refused = comfy.post("/prompt", json={"prompt": graph})
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_prompt"

        # with a GPU node among them, a request takes a GPU (CPU-only nodes only where
        # the class allows CPU offload): it runs on the node with the card
        ran = comfy.post("/prompt", json={"prompt": txt2img_workflow("y", steps=2, size=32)})
        prompt_id = ran.json()["prompt_id"]
        entry = eventually(lambda: comfy.get(f"/history/{prompt_id}").json(), 60, "history")
        assert entry[prompt_id]["status"]["status_str"] == "success"
    with cluster.client() as http:
        jobs = http.get("/v1/jobs", params={"limit": 20}).json()["jobs"]
        (job,) = [j for j in jobs if j["payload"].get("prompt_id") == prompt_id]
        assert (job["node"], job["resources"]["gpus"]) == ("richer", 1)
        assert job["resources"]["cpu_fallback"] is True
