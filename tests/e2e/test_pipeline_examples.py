"""The pipeline and array examples (``examples/pipelines``) run as their comments say: a
real server and agent driving the reference AUTOMATIC1111 webui (the backend of
``corral up --demo``), submitted with ``corral pipeline submit`` and ``corral array
submit``. The upscale step gets the txt2img step's image and doubles it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_harness import ADMIN, CLI, Cluster
from PIL import Image

from corral.agent.reference.a1111 import ReferenceA1111
from corral.agent.reference.serve import serving_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def corral(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_URL": cluster.http, "CORRAL_TOKEN": ADMIN}
    argv = [sys.executable, "-c", CLI, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)


def test_the_examples_run_on_the_a1111_backend(cluster: Cluster) -> None:
    with serving_in_thread(ReferenceA1111().app) as webui:
        cluster.start_server()
        cluster.start_agent("gpu-box", "--a1111", webui, "--cpus", "1")
        piped = corral(
            cluster,
            "pipeline", "submit", str(EXAMPLES / "txt2img-upscale.yaml"), "--follow", "--json",
        )  # fmt: skip
        assert piped.returncode == 0, piped.stdout + piped.stderr + cluster.logs()
        body = json.loads(piped.stdout)
        assert body["state"] == "succeeded"
        upscale = next(j for j in body["jobs"] if j["pipeline"]["step"] == "upscale")
        assert [f["name"] for f in upscale["inputs"]] == ["fox.png"]
        with cluster.client() as http:
            png = http.get(f"/v1/jobs/{upscale['id']}/result/image-0.png").content
        assert Image.open(io.BytesIO(png)).size == (128, 128)  # 64 x 64, doubled

        seeds = corral(
            cluster,
            "array", "submit", str(EXAMPLES / "seeds.yaml"),
            "--count", "3", "--index-key", "seed", "--start", "1000", "--follow", "--json",
        )  # fmt: skip
        assert seeds.returncode == 0, seeds.stdout + seeds.stderr
        array = json.loads(seeds.stdout)
        assert array["counts"] == {"succeeded": 3}
        assert sorted(j["payload"]["seed"] for j in array["jobs"]) == [1000, 1001, 1002]
