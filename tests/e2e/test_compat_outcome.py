"""How a drop-in request ended and what ran, against real processes: server, agent and
the reference AUTOMATIC1111 and ComfyUI.

What the agent filled in (the drawn seed, the webui's default sampler, the checkpoint)
is the corral job's ``ran`` and shows in the webui's ``info``/``parameters`` and in
ComfyUI's ``/history``. A ComfyUI prompt interrupted before it saved an image ends
``cancelled`` and ``interrupted`` (docs/server.md), and the CLI shows "interrupted".
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import webuiapi
from compat_harness import CompatCluster, compat_cluster
from e2e_harness import ADMIN, eventually
from typer.testing import CliRunner

from corral.agent.reference.comfyui import txt2img_workflow
from corral.cli.main import app

pytestmark = pytest.mark.timeout(240)
BASIC = {"Authorization": "Basic " + base64.b64encode(f"me:{ADMIN}".encode()).decode()}


@pytest.fixture(scope="module")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CompatCluster]:
    yield from compat_cluster(Path(tmp_path_factory.mktemp("compat-outcome")))


def job_of(corral: CompatCluster, **payload: Any) -> dict[str, Any]:
    """The corral job whose payload has these values (the newest such)."""
    with corral.cluster.client() as http:
        jobs = http.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
    return next(j for j in jobs if all(j["payload"].get(k) == v for k, v in payload.items()))


def test_a1111_info_and_parameters_and_the_job_name_what_ran(corral: CompatCluster) -> None:
    api = webuiapi.WebUIApi(host="127.0.0.1", port=corral.port, username="al", password=ADMIN)
    result = api.txt2img(prompt="a drawn seed", steps=2, width=32, height=32)  # seed -1
    drawn = result.info["seed"]
    assert drawn != -1
    assert result.parameters["seed"] == drawn  # the seed that ran, not the -1 asked for
    job = job_of(corral, prompt="a drawn seed")
    assert job["ran"]["seed"] == str(drawn)
    assert job["ran"]["model"] == result.info["sd_model_name"] == "tiny-sd"
    body = {"prompt": "no sampler named", "steps": 2, "width": 32, "height": 32}
    with httpx.Client(base_url=corral.http, headers=BASIC, timeout=60) as http:
        answer = http.post("/sdapi/v1/txt2img", json=body).json()
    assert answer["parameters"]["sampler_name"] == "Euler a"  # the webui's default
    assert json.loads(answer["info"])["sampler_name"] == "Euler a"
    assert job_of(corral, prompt="no sampler named")["ran"]["sampler_name"] == "Euler a"


def test_comfyui_history_and_the_job_name_the_checkpoint_that_ran(corral: CompatCluster) -> None:
    prompt_id = str(uuid.uuid4())
    body = {"prompt": txt2img_workflow("ran", steps=2, size=32), "prompt_id": prompt_id}
    with httpx.Client(base_url=corral.http, headers=BASIC, timeout=30) as http:
        assert http.post("/prompt", json=body).status_code == 200

        def history() -> dict[str, Any] | None:
            entry = http.get(f"/history/{prompt_id}").json().get(prompt_id)
            return entry if entry and entry["status"]["completed"] else None

        entry = eventually(history, 60, "the prompt in /history")
    assert entry["prompt"][2]["4"]["inputs"]["ckpt_name"] == "tiny.safetensors"
    assert job_of(corral, prompt_id=prompt_id)["ran"] == {"model": "tiny.safetensors"}


def test_a_comfyui_prompt_interrupted_before_it_saved_is_cancelled_and_interrupted(
    corral: CompatCluster, tmp_path: Path
) -> None:
    prompt_id = str(uuid.uuid4())
    body = {"prompt": txt2img_workflow("long", steps=500, size=32), "prompt_id": prompt_id}
    with httpx.Client(base_url=corral.http, headers=BASIC, timeout=30) as http:
        assert http.post("/prompt", json=body).status_code == 200

        def running() -> bool:
            queue = http.get("/queue").json()
            return [item[1] for item in queue["queue_running"]] == [prompt_id]

        eventually(running, 30, "the prompt running")
        eventually(lambda: job_of(corral, prompt_id=prompt_id)["progress"] > 0, 30, "progress")
        http.post("/interrupt", json={"prompt_id": prompt_id})
        ended = eventually(
            lambda: (j := job_of(corral, prompt_id=prompt_id))["finished_at"] and j, 60, "its end"
        )
    assert (ended["state"], ended["interrupted"], ended["result"]) == ("cancelled", True, [])
    assert ended["error"] == "interrupted before it saved anything"
    env = {"CORRAL_URL": corral.http, "CORRAL_TOKEN": ADMIN}
    env["CORRAL_CONFIG"] = str(tmp_path / "config.toml")
    shown = CliRunner().invoke(app, ["job", ended["id"]], env=env)
    assert shown.exit_code == 0, shown.output
    assert "interrupted (cancelled)" in shown.output
    listed = CliRunner().invoke(app, ["jobs", "--state", "cancelled"], env=env)
    line = next(row for row in listed.output.splitlines() if ended["id"] in row)
    assert "interrupted" in line
