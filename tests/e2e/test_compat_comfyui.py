"""The ComfyUI API on corral, driven by a client written the way ComfyUI's own
``script_examples/websockets_api_example.py`` is (urllib for HTTP, a websocket for
progress), against real processes: server, agent, reference ComfyUI."""

from __future__ import annotations

import base64
import io
import json
import struct
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_harness import CompatCluster, compat_cluster
from e2e_harness import ADMIN, eventually, submit, wait_state
from PIL import Image
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corral.agent.reference.comfyui import two_branch_workflow, txt2img_workflow

pytestmark = pytest.mark.timeout(240)
AUTH = {"Authorization": "Basic " + base64.b64encode(f"me:{ADMIN}".encode()).decode()}


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CompatCluster]:
    yield from compat_cluster(Path(tmp_path_factory.mktemp("compat-comfyui")))


class ComfyClient:
    """ComfyUI's websocket example, as a class, with the Basic credentials a proxy wants."""

    def __init__(self, server_address: str) -> None:
        self.server_address = server_address
        self.client_id = str(uuid.uuid4())

    def connect(self) -> ClientConnection:
        url = f"ws://{self.server_address}/ws?clientId={self.client_id}"
        return connect(url, additional_headers=AUTH)

    def queue_prompt(self, prompt: dict[str, Any], prompt_id: str) -> dict[str, Any]:
        p = {"prompt": prompt, "client_id": self.client_id, "prompt_id": prompt_id}
        data = json.dumps(p).encode("utf-8")
        req = urllib.request.Request(
            f"http://{self.server_address}/prompt", data=data, headers=AUTH
        )
        answer: dict[str, Any] = json.loads(urllib.request.urlopen(req).read())
        return answer

    def get(self, path: str) -> Any:
        req = urllib.request.Request(f"http://{self.server_address}{path}", headers=AUTH)
        with urllib.request.urlopen(req) as response:
            return response.read()

    def post(self, path: str, body: dict[str, Any]) -> None:
        req = urllib.request.Request(
            f"http://{self.server_address}{path}", data=json.dumps(body).encode(), headers=AUTH
        )
        urllib.request.urlopen(req).read()

    def get_image(self, filename: str, subfolder: str, folder_type: str) -> bytes:
        data = {"filename": filename, "subfolder": subfolder, "type": folder_type}
        data_bytes: bytes = self.get(f"/view?{urllib.parse.urlencode(data)}")
        return data_bytes

    def get_history(self, prompt_id: str) -> dict[str, Any]:
        history: dict[str, Any] = json.loads(self.get(f"/history/{prompt_id}"))
        return history

    def follow(
        self, ws: ClientConnection, prompt_id: str
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        """Messages and binary previews until ``executing`` with no node for ``prompt_id``."""
        messages: list[dict[str, Any]] = []
        previews: list[bytes] = []
        while True:
            out = ws.recv(timeout=60)
            if isinstance(out, str):
                message = json.loads(out)
                messages.append(message)
                if message["type"] == "executing":
                    data = message["data"]
                    if data["node"] is None and data["prompt_id"] == prompt_id:
                        return messages, previews  # execution is done
            else:
                previews.append(out)

    def get_images(self, prompt_id: str) -> dict[str, list[bytes]]:
        history = self.get_history(prompt_id)[prompt_id]
        output_images = {}
        for node_id in history["outputs"]:
            node_output = history["outputs"][node_id]
            images_output = []
            if "images" in node_output:
                for image in node_output["images"]:
                    images_output.append(
                        self.get_image(image["filename"], image["subfolder"], image["type"])
                    )
            output_images[node_id] = images_output
        return output_images


def comfy(corral: CompatCluster) -> ComfyClient:
    return ComfyClient(corral.http.removeprefix("http://"))


def test_a_prompt_runs_with_progress_and_previews_and_its_images_come_back(
    corral: CompatCluster,
) -> None:
    client = comfy(corral)
    prompt_id = str(uuid.uuid4())
    with client.connect() as ws:
        hello = json.loads(ws.recv(timeout=10))
        assert hello == {
            "type": "status",
            "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": client.client_id},
        }
        answer = client.queue_prompt(txt2img_workflow("a red barn", steps=6, size=64), prompt_id)
        assert answer["prompt_id"] == prompt_id
        messages, previews = client.follow(ws, prompt_id)
    kinds = [m["type"] for m in messages]
    assert kinds[:2] == ["execution_start", "execution_cached"]
    assert kinds[-2:] == ["execution_success", "executing"]
    progress = [m["data"] for m in messages if m["type"] == "progress"]
    assert [p["value"] for p in progress] == list(range(1, 7))
    assert {(p["max"], p["node"], p["prompt_id"]) for p in progress} == {(6, "3", prompt_id)}
    assert {"node": "3", "display_node": "3", "prompt_id": prompt_id} in [
        m["data"] for m in messages if m["type"] == "executing"
    ]
    assert previews, "binary preview frames"
    for frame in previews:
        assert struct.unpack(">II", frame[:8]) == (1, 1)  # preview image, JPEG
        Image.open(io.BytesIO(frame[8:])).verify()
    images = client.get_images(prompt_id)
    (png,) = images["9"]
    assert Image.open(io.BytesIO(png)).size == (64, 64)
    executed = next(m["data"] for m in messages if m["type"] == "executed")
    assert executed["node"] == "9"
    assert executed["output"] == client.get_history(prompt_id)[prompt_id]["outputs"]["9"]


def test_a_chosen_prompt_id_is_honoured_and_runs_once(corral: CompatCluster) -> None:
    client = comfy(corral)
    prompt_id = f"my-id-{uuid.uuid4().hex[:8]}"
    workflow = txt2img_workflow("once", steps=2, size=32)
    with client.connect() as ws:
        first = client.queue_prompt(workflow, prompt_id)
        again = client.queue_prompt(workflow, prompt_id)  # a client retrying after a timeout
        client.follow(ws, prompt_id)
    assert first == again
    assert first["prompt_id"] == prompt_id
    with corral.cluster.client() as http:
        jobs = http.get("/v1/jobs", params={"user": "me", "limit": 500}).json()["jobs"]
    assert [j["payload"].get("prompt_id") for j in jobs].count(prompt_id) == 1
    with pytest.raises(urllib.error.HTTPError) as refused:
        client.queue_prompt(txt2img_workflow("another", steps=2, size=32), prompt_id)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"]["type"] == "duplicate_prompt_id"


def test_queue_shows_a_running_prompt_and_interrupt_stops_it(corral: CompatCluster) -> None:
    client = comfy(corral)
    prompt_id = str(uuid.uuid4())
    with client.connect() as ws:
        client.queue_prompt(txt2img_workflow("long", steps=500, size=32), prompt_id)

        def running() -> bool:
            queue = json.loads(client.get("/queue"))
            return [item[1] for item in queue["queue_running"]] == [prompt_id]

        eventually(running, 30, "the prompt running in /queue")
        client.post("/interrupt", {"prompt_id": prompt_id})
        messages, _ = client.follow(ws, prompt_id)
    assert "execution_interrupted" in [m["type"] for m in messages]
    status = client.get_history(prompt_id)[prompt_id]["status"]
    assert (status["status_str"], status["completed"]) == ("error", False)
    assert json.loads(client.get("/queue")) == {"queue_running": [], "queue_pending": []}


def test_object_info_comes_from_the_backend_and_a_missing_checkpoint_is_refused(
    corral: CompatCluster,
) -> None:
    client = comfy(corral)
    info = json.loads(client.get("/object_info"))
    assert info["KSampler"]["input"]["required"]["sampler_name"][0][0] == "euler"
    ckpts = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
    assert ckpts == ["tiny.safetensors", "tiny-v2.safetensors"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        client.queue_prompt(txt2img_workflow("x", ckpt="sdxl.safetensors"), str(uuid.uuid4()))
    body = json.loads(refused.value.read())
    assert refused.value.code == 400
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    (problem,) = body["node_errors"]["4"]["errors"]
    assert problem["type"] == "value_not_in_list"
    assert problem["message"] == "Value not in list"  # ComfyUI's own words
    assert problem["details"] == (
        "ckpt_name: 'sdxl.safetensors' not in ['tiny.safetensors', 'tiny-v2.safetensors']"
    )


def test_the_websocket_and_the_api_want_credentials(corral: CompatCluster) -> None:
    address = corral.http.removeprefix("http://")
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{address}/ws?clientId=x")
    assert refused.value.response.status_code == 401
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"http://{address}/object_info")
    assert denied.value.code == 401
    assert json.loads(denied.value.read())["error"]["type"] == "unauthorized"
    with connect(f"ws://{address}/ws?clientId=x&token={ADMIN}") as ws:  # browsers: ?token=
        assert json.loads(ws.recv(timeout=10))["data"]["sid"] == "x"


def test_a_bad_branch_is_dropped_with_its_reason_and_the_rest_runs(corral: CompatCluster) -> None:
    """ComfyUI's answer to a graph with one invalid output: 200, ``node_errors``, the
    valid outputs run."""
    client = comfy(corral)
    prompt_id = str(uuid.uuid4())
    with client.connect() as ws:
        answer = client.queue_prompt(two_branch_workflow("two", width=0), prompt_id)
        client.follow(ws, prompt_id)
    (err,) = answer["node_errors"]["13"]["errors"]
    assert answer["node_errors"]["13"]["dependent_outputs"] == ["12"]
    assert (err["type"], err["message"], err["details"]) == (
        "value_smaller_than_min",
        "Value 0 smaller than min of 16",
        "width",
    )
    entry = client.get_history(prompt_id)[prompt_id]
    assert entry["status"]["status_str"] == "success"
    assert list(entry["outputs"]) == ["9"]


def test_a_graph_with_no_valid_output_gets_comfyuis_400(corral: CompatCluster) -> None:
    graph = txt2img_workflow("x", steps=20_000)
    graph["3"]["inputs"]["sampler_name"] = "plms"
    with pytest.raises(urllib.error.HTTPError) as refused:
        comfy(corral).queue_prompt(graph, str(uuid.uuid4()))
    assert refused.value.code == 400
    body = json.loads(refused.value.read())
    assert body["error"]["type"] == "prompt_outputs_failed_validation"
    # ComfyUI's details quote only the output nodes' own errors: here, none
    assert body["error"]["details"] == ""
    assert [e["type"] for e in body["node_errors"]["3"]["errors"]] == [
        "value_bigger_than_max",
        "value_not_in_list",
    ]


def test_a_job_whose_outputs_comfyui_drops_fails_naming_the_reason(corral: CompatCluster) -> None:
    """A corral job (not the drop-in) never succeeds with an output dropped; its error,
    which the CLI, SDK and dashboard show, names node, class, input and ComfyUI's message."""
    with corral.cluster.client() as http:
        job = submit(
            http, backend="comfyui", payload={"workflow": two_branch_workflow("two", width=0)}
        )
        failed = wait_state(http, job["id"], "failed", "succeeded", timeout=60)
    assert failed["state"] == "failed"
    assert "comfyui dropped output nodes #12" in failed["error"]
    assert (
        "node #13 (EmptyLatentImage) input width: Value 0 smaller than min of 16"
        in (failed["error"])
    )


def test_a_saved_latent_is_listed_under_latents_in_its_subfolder(corral: CompatCluster) -> None:
    client = comfy(corral)
    graph = txt2img_workflow("latent", steps=2, size=32)
    graph["20"] = {
        "class_type": "SaveLatent",
        "inputs": {"samples": ["3", 0], "filename_prefix": "latents/ComfyUI"},
    }
    prompt_id = str(uuid.uuid4())
    with client.connect() as ws:
        client.queue_prompt(graph, prompt_id)
        messages, _ = client.follow(ws, prompt_id)
    outputs = client.get_history(prompt_id)[prompt_id]["outputs"]
    assert sorted(outputs) == ["20", "9"]
    (latent,) = outputs["20"]["latents"]
    assert latent["subfolder"].endswith("/latents")
    assert latent["filename"].endswith(".latent")
    assert client.get_image(latent["filename"], latent["subfolder"], latent["type"])
    executed = {m["data"]["node"]: m["data"]["output"] for m in messages if m["type"] == "executed"}
    assert executed == outputs
