"""Input images end to end, against real processes (server, agent, reference ComfyUI and
AUTOMATIC1111): a ComfyUI client uploads an image with ``/upload/image`` and queues an
img2img-style graph with ``LoadImage``; the native API takes a file (``POST /v1/inputs``)
that jobs then name; only the uploader's team may name its files."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from compat_harness import CompatCluster, compat_cluster
from e2e_harness import ADMIN, CLI, submit, wait_state
from PIL import Image
from websockets.sync.client import connect

from corral.sdk import Client

pytestmark = pytest.mark.timeout(240)
BASIC = {"Authorization": "Basic " + base64.b64encode(f"me:{ADMIN}".encode()).decode()}


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CompatCluster]:
    yield from compat_cluster(Path(tmp_path_factory.mktemp("compat-inputs")))


def png(color: tuple[int, int, int], size: tuple[int, int] = (24, 12)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def edit_graph(image: str) -> dict[str, Any]:
    """Load the uploaded picture, invert it, halve it, save it."""
    return {
        "10": {"class_type": "LoadImage", "inputs": {"image": image}},
        "11": {"class_type": "ImageInvert", "inputs": {"image": ["10", 0]}},
        "12": {
            "class_type": "ImageScale",
            "inputs": {
                "image": ["11", 0],
                "upscale_method": "bilinear",
                "width": 12,
                "height": 6,
                "crop": "disabled",
            },
        },
        "13": {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": "x"}},
    }


def comfy(corral: CompatCluster) -> httpx.Client:
    return httpx.Client(base_url=corral.http, headers=BASIC, timeout=30)


def test_a_comfyui_client_uploads_an_image_and_gets_the_edited_picture(
    corral: CompatCluster,
) -> None:
    with comfy(corral) as client:
        run_an_uploaded_image(corral, client)


def run_an_uploaded_image(corral: CompatCluster, client: httpx.Client) -> None:
    client_id = str(uuid.uuid4())
    sent = client.post(
        "/upload/image", files={"image": ("photo.png", png((250, 10, 0)))}, data={"type": "input"}
    )
    assert sent.json() == {"name": "photo.png", "subfolder": "", "type": "input"}
    again = client.post("/upload/image", files={"image": ("photo.png", png((0, 0, 0)))})
    assert again.json()["name"] == "photo (1).png"  # a name taken by other bytes, as ComfyUI
    listed = client.get("/object_info").json()["LoadImage"]["input"]["required"]["image"]
    assert listed[0] == ["photo (1).png", "photo.png"]
    url = corral.http.replace("http://", "ws://") + f"/ws?clientId={client_id}"
    with connect(url, additional_headers=BASIC) as ws:
        prompt_id = str(uuid.uuid4())
        body = {"prompt": edit_graph("photo.png"), "client_id": client_id, "prompt_id": prompt_id}
        assert client.post("/prompt", json=body).json()["node_errors"] == {}
        while True:
            message = ws.recv(timeout=60)
            if isinstance(message, str):
                data = json.loads(message)
                if data["type"] == "execution_error":
                    raise AssertionError(data)
                if data["type"] == "executing" and data["data"]["node"] is None:
                    break
    history = client.get(f"/history/{prompt_id}").json()[prompt_id]
    [saved] = history["outputs"]["13"]["images"]
    picture = client.get("/view", params=saved).content
    with Image.open(io.BytesIO(picture)) as out:
        assert out.size == (12, 6)
        assert out.convert("RGB").getpixel((6, 3)) == (5, 245, 255)  # (250, 10, 0) inverted


def test_a_prompt_naming_an_image_nobody_uploaded_gets_comfyuis_400(
    corral: CompatCluster,
) -> None:
    with comfy(corral) as client:
        refused = client.post("/prompt", json={"prompt": edit_graph("missing.png")})
    assert refused.status_code == 400
    [error] = refused.json()["node_errors"]["10"]["errors"]
    assert error["type"] == "custom_validation_failed"
    assert error["details"] == "image - Invalid image file: missing.png"


def test_native_inputs_are_stored_once_and_read_by_comfyui_and_a1111_jobs(
    corral: CompatCluster,
) -> None:
    with corral.cluster.client() as admin:
        native_inputs(corral, admin)


def native_inputs(corral: CompatCluster, admin: httpx.Client) -> None:
    folder = corral.cluster.tmp / "server" / "blobs" / "inputs"
    before = set(folder.iterdir()) if folder.exists() else set()
    data = png((0, 128, 255))
    first = admin.post("/v1/inputs", params={"name": "sky.png"}, content=data)
    assert first.status_code == 201, first.text
    blob = first.json()["blob"]
    assert admin.post("/v1/inputs", params={"name": "again.png"}, content=data).json() == (
        first.json()  # the same bytes: the same file, its first name kept
    )
    assert [p.name for p in set(folder.iterdir()) - before] == [blob]  # stored once
    inputs = [{"blob": blob, "name": "sky.png"}]
    comfy_job = submit(
        admin,
        kind="sample",
        backend="comfyui",
        resources={"gpus": 0, "cpus": 1},
        payload={"workflow": edit_graph("sky.png")},
        inputs=inputs,
    )
    assert comfy_job["inputs"] == inputs
    a1111_job = submit(
        admin,
        kind="sample",
        backend="a1111",
        resources={"gpus": 0, "cpus": 1},
        payload={"mode": "img2img", "prompt": "a sky", "steps": 2, "width": 32, "height": 32},
        inputs=inputs,
    )
    done = wait_state(admin, comfy_job["id"], "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded", done["error"]
    [name] = [f["name"] for f in done["result"] if f["name"].endswith(".png")]
    image = admin.get(f"/v1/jobs/{comfy_job['id']}/result/{name}")
    with Image.open(io.BytesIO(image.content)) as out:
        assert out.convert("RGB").getpixel((6, 3)) == (255, 127, 0)
    done = wait_state(admin, a1111_job["id"], "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded", done["error"]


def team_token(admin: httpx.Client, team: str) -> dict[str, str]:
    made = admin.post("/v1/tokens", json={"kind": "team", "name": team, "team": team})
    return {"Authorization": f"Bearer {made.json()['token']}"}


def test_a_team_may_name_only_its_own_input_files(corral: CompatCluster) -> None:
    with corral.cluster.client() as admin:
        tokens = team_token(admin, "red"), team_token(admin, "blue")
    with (
        httpx.Client(base_url=corral.http, headers=tokens[0]) as red,
        httpx.Client(base_url=corral.http, headers=tokens[1]) as blue,
    ):
        only_its_own(red, blue)


def only_its_own(red: httpx.Client, blue: httpx.Client) -> None:
    blob = red.post("/v1/inputs", params={"name": "r.png"}, content=png((1, 2, 3))).json()["blob"]
    spec = {"kind": "sample", "backend": "comfyui", "payload": {"workflow": edit_graph("r.png")}}
    refused = blue.post("/v1/jobs", json={**spec, "inputs": [{"blob": blob, "name": "r.png"}]})
    assert refused.status_code == 422
    assert refused.json()["field"] == "inputs[0].blob"
    assert blue.get(f"/v1/inputs/{blob}").status_code == 404
    assert red.get(f"/v1/inputs/{blob}").json()["name"] == "r.png"
    bad = red.post("/v1/jobs", json={**spec, "inputs": [{"blob": "nothex", "name": "r.png"}]})
    assert bad.status_code == 422
    assert "inputs" in bad.json()["field"]


def test_the_sdk_and_the_cli_attach_input_files_to_jobs(
    corral: CompatCluster, tmp_path: Path
) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(png((40, 80, 120)))
    spec = {
        "kind": "sample",
        "backend": "comfyui",
        "payload": {"workflow": edit_graph("photo.png")},
        "resources": {"gpus": 0, "cpus": 1},
    }
    with Client(corral.http, token=ADMIN) as sdk, corral.cluster.client() as admin:
        job = sdk.submit(spec, files=[photo])
        wait_state(admin, job.id, "succeeded", "failed", timeout=120)
        result = job.result()
        [name] = [n for n in result.names if n.endswith(".png")]
        with Image.open(io.BytesIO(result.read(name))) as out:
            assert out.convert("RGB").getpixel((6, 3)) == (215, 175, 135)
    jobfile = tmp_path / "job.json"
    jobfile.write_text(json.dumps({**spec, "payload": {"workflow": edit_graph("in.png")}}))
    argv = [sys.executable, "-c", CLI, "submit", str(jobfile), "--input", f"in.png={photo}"]
    argv += ["--url", corral.http, "--token", ADMIN, "--quiet"]
    job_id = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    with corral.cluster.client() as admin:
        done = wait_state(admin, job_id, "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded", (done["error"], done["inputs"], done["payload"])
    assert [i["name"] for i in done["inputs"]] == ["in.png"]


def test_a_job_whose_input_is_gone_before_it_runs_fails_saying_so(corral: CompatCluster) -> None:
    with corral.cluster.client() as admin:
        blob = admin.post("/v1/inputs", params={"name": "g.png"}, content=png((9, 9, 9)))
        sha = blob.json()["blob"]
        assert admin.post("/v1/nodes/box/pause").status_code == 200
        try:
            job = submit(
                admin,
                kind="sample",
                backend="comfyui",
                resources={"gpus": 0, "cpus": 1},
                payload={"workflow": edit_graph("g.png")},
                inputs=[{"blob": sha, "name": "g.png"}],
                max_attempts=1,
            )
            assert admin.delete(f"/v1/inputs/{sha}").status_code == 204  # its bytes go too
        finally:
            admin.post("/v1/nodes/box/resume")
        done = wait_state(admin, job["id"], "succeeded", "failed", timeout=120)
    assert done["state"] == "failed"
    assert "could not fetch the job's input files" in done["error"]
