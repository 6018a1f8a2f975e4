"""Jobs go where their models are; a backend lacking one sends the job elsewhere.

A real server and two real agent processes, each driving its own reference
ComfyUI (run in this process, so a test can add and delete model files as a
person would in ``models/``). The agents report what their backends have on
disk (checkpoints, LoRAs, VAEs); a job's graph names its models and the
scheduler sends it to the node that has them all. A node whose list was stale
refuses the graph (``value_not_in_list``): the job moves to the other node,
which has the model, and succeeds; the refusing agent lists its models again.
A model no node has fails the job, naming it and the nodes, once each node said
so, however few attempts the job allowed. The same for webuis and the LoRAs
their prompts name (``<lora:name:weight>``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from e2e_harness import Cluster, eventually, submit, wait_state

from corral.agent.reference.a1111 import ReferenceA1111
from corral.agent.reference.comfyui import ReferenceComfyUI, txt2img_workflow
from corral.agent.reference.serve import serving_in_thread

pytestmark = pytest.mark.slow


@contextmanager
def backend(server: Any) -> Iterator[str]:
    """Serve ``server`` (a reference ComfyUI or webui) from a thread of this process."""
    with serving_in_thread(server.app) as url:
        yield url


def graph_job(http: httpx.Client, **workflow: Any) -> dict[str, Any]:
    """A ComfyUI graph through ``/v1/jobs``: its models come from the graph itself."""
    graph = txt2img_workflow("a lighthouse", steps=2, **workflow)
    return submit(
        http,
        kind="sample",
        backend="comfyui",
        payload={"workflow": graph},
        resources={"gpus": 0, "cpus": 1},
        max_attempts=1,  # a node lacking a model does not use an attempt up
    )


def on_disk(http: httpx.Client) -> dict[str, set[str]]:
    return {n["name"]: set(n["models_on_disk"]) for n in http.get("/v1/nodes").json()}


@pytest.fixture
def two_nodes(cluster: Cluster) -> Iterator[tuple[ReferenceComfyUI, ReferenceComfyUI]]:
    ink = ReferenceComfyUI(
        checkpoints=("tiny.safetensors", "old.safetensors"), loras=("ink.safetensors",)
    )
    paper = ReferenceComfyUI(checkpoints=("tiny.safetensors",), loras=("paper.safetensors",))
    with backend(ink) as url_a, backend(paper) as url_b:
        cluster.start_server()
        cluster.start_agent("gpu-a", "--comfyui", url_a, "--cpus", "1")
        cluster.start_agent("gpu-b", "--comfyui", url_b, "--cpus", "1")
        with cluster.client() as http:
            eventually(
                lambda: (
                    {"lora:ink.safetensors", "old.safetensors"} <= on_disk(http).get("gpu-a", set())
                    and "lora:paper.safetensors" in on_disk(http).get("gpu-b", set())
                ),
                timeout=30,
                what="both inventories reported",
            )
        yield ink, paper


def test_a_job_goes_to_the_node_whose_backend_has_its_lora(
    cluster: Cluster, two_nodes: tuple[ReferenceComfyUI, ReferenceComfyUI]
) -> None:
    with cluster.client() as http:
        nodes = on_disk(http)
        assert {"tiny.safetensors", "vae:tiny-vae.safetensors"} <= nodes["gpu-a"] & nodes["gpu-b"]
        for lora, node in [("ink", "gpu-a"), ("paper", "gpu-b")] * 2:
            job = graph_job(http, lora=f"{lora}.safetensors")
            assert f"lora:{lora}.safetensors" in job["models"]
            done = wait_state(http, job["id"], "succeeded", "failed", timeout=60)
            assert (done["state"], done["node"]) == ("succeeded", node), done
            assert done["attempts"] == [], "it went where its LoRA is at once"


def test_a_stale_list_sends_the_job_to_the_node_that_has_the_checkpoint(
    cluster: Cluster, two_nodes: tuple[ReferenceComfyUI, ReferenceComfyUI]
) -> None:
    ink, paper = two_nodes
    # Someone moves old.safetensors from the first box to the second after both agents
    # listed their models: the server still believes the first has it.
    ink.checkpoints = ("tiny.safetensors",)
    paper.checkpoints = ("tiny.safetensors", "old.safetensors")
    with cluster.client() as http:
        job = graph_job(http, ckpt="old.safetensors")
        done = wait_state(http, job["id"], "succeeded", "failed", timeout=60)
        assert (done["state"], done["node"]) == ("succeeded", "gpu-b"), done
        (refused,) = done["attempts"]
        assert refused["node"] == "gpu-a"
        assert 'models missing on this node: ["old.safetensors"]' in refused["error"]
        # the refusing agent listed its backend's models again: the stale entry is gone
        eventually(
            lambda: "old.safetensors" not in on_disk(http)["gpu-a"],
            timeout=30,
            what="gpu-a's list corrected",
        )
        node = {n["name"]: n for n in http.get("/v1/nodes").json()}["gpu-a"]
        assert not node["paused"], "lacking a model is not a broken node"


def test_a_model_no_node_has_fails_naming_it_once_every_node_said_so(
    cluster: Cluster, two_nodes: tuple[ReferenceComfyUI, ReferenceComfyUI]
) -> None:
    with cluster.client() as http:
        job = graph_job(http, lora="nowhere.safetensors")
        done = wait_state(http, job["id"], "succeeded", "failed", timeout=60)
        assert done["state"] == "failed", done
        assert {a["node"] for a in done["attempts"]} == {"gpu-a", "gpu-b"}
        assert done["error"].startswith(
            "no node has model lora:nowhere.safetensors: every node with the comfyui backend "
            "said it lacks it (gpu-a, gpu-b)"
        ), done["error"]


def test_a_webui_prompt_goes_where_its_lora_is_and_fails_when_none_has_it(
    cluster: Cluster,
) -> None:
    ink, paper = ReferenceA1111(loras=("ink",)), ReferenceA1111(loras=("paper",))
    with backend(ink) as url_a, backend(paper) as url_b:
        cluster.start_server()
        cluster.start_agent("gpu-a", "--a1111", url_a, "--cpus", "1")
        cluster.start_agent("gpu-b", "--a1111", url_b, "--cpus", "1")
        with cluster.client() as http:
            eventually(
                lambda: "lora:paper" in on_disk(http).get("gpu-b", set()),
                timeout=30,
                what="the webuis' LoRAs reported",
            )
            assert "lora:ink" in on_disk(http)["gpu-a"]
            done: dict[str, dict[str, Any]] = {}
            for lora in ("paper", "ink", "nowhere"):
                job = submit(
                    http,
                    kind="sample",
                    backend="a1111",
                    payload={"prompt": f"a fox <lora:{lora}:0.7>", "steps": 2, "width": 32},
                    resources={"gpus": 0, "cpus": 1},
                    max_attempts=1,
                )
                done[lora] = wait_state(http, job["id"], "succeeded", "failed", timeout=90)
    assert (done["paper"]["state"], done["paper"]["node"]) == ("succeeded", "gpu-b")
    assert (done["ink"]["state"], done["ink"]["node"]) == ("succeeded", "gpu-a")
    assert done["paper"]["attempts"] == done["ink"]["attempts"] == []
    assert done["nowhere"]["state"] == "failed"
    assert done["nowhere"]["error"].startswith(
        "no node has model lora:nowhere: every node with the a1111 backend said it lacks it"
    ), done["nowhere"]["error"]
