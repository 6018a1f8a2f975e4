"""`corral up --demo` on a machine without a GPU: an existing AUTOMATIC1111 client
(``webuiapi``) pointed at it gets images back, made by the CPU reference webui."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import webuiapi
from e2e_harness import CLI, Proc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_corral_up_demo_answers_an_a1111_client_without_a_gpu(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", CLI, "up", "--demo", "--port", "0", "--agent-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    up = Proc(
        "corral up --demo", [*argv, "--data-dir", str(tmp_path)], env | {"PYTHONUNBUFFERED": "1"}
    )
    try:
        token = up.wait_for(r"admin token: (\S+)", timeout=120).group(1)
        api_url = up.wait_for(r"AUTOMATIC1111 API: (http://\S+/sdapi/v1)").group(1)
        api = webuiapi.WebUIApi(baseurl=api_url, username="me", password=token)
        made = api.txt2img(prompt="a red barn", steps=3, width=32, height=32, seed=5)
        assert made.image.size == (32, 32)
        assert made.info["seed"] == 5
        changed = api.img2img(
            images=[made.image],
            prompt="at night",
            steps=3,
            width=32,
            height=32,
            denoising_strength=0.5,
        )
        assert changed.image.size == (32, 32)
        assert up.interrupt(timeout=30) == 0
    finally:
        up.stop()
        print(up.log())
