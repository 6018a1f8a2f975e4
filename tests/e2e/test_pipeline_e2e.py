"""A pipeline through real processes: `corral server` and one `corral agent` running each
step as a command. The second step reads the first step's 2 MiB result: the agent made it,
so it is handed over as a hard link of its own copy, with no transfer through the server."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path

import pytest
from e2e_harness import Cluster, eventually

pytestmark = pytest.mark.slow

STEP = textwrap.dedent(
    """
    import hashlib, json, os, pathlib
    payload = json.loads(os.environ["CORRAL_PAYLOAD"])
    out = pathlib.Path(os.environ["CORRAL_OUTPUT_DIR"])
    if "make" in payload:
        (out / "latent.bin").write_bytes(bytes(range(256)) * (payload["make"] // 256))
    for name, path in json.loads(os.environ["CORRAL_INPUTS"]).items():
        digest = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
        (out / "digest.txt").write_text(f"{name} {digest}")
    """
)
SIZE = 2 * 1024 * 1024  # over the agent's inline limit: uploaded as a blob


def test_a_pipeline_passes_a_large_file_between_steps_on_one_machine(
    cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "step.py"
    script.write_text(STEP)
    cluster.start_server()
    agent = cluster.start_agent("a1", "--cpus", "1", "--command", f"{sys.executable} {script}")
    steps = {
        "encode": {"kind": "train", "payload": {"make": SIZE}, "outputs": ["latent.bin"]},
        "decode": {
            "kind": "train",
            "inputs": [{"from": "encode", "file": "latent.bin", "as": "in.bin"}],
        },
    }
    with cluster.client() as http:
        made = http.post("/v1/pipelines", json={"steps": steps})
        assert made.status_code == 201, made.text
        pipe = made.json()["id"]
        done = eventually(
            lambda: (g := http.get(f"/v1/pipelines/{pipe}").json())["state"] != "running" and g,
            timeout=60,
            what="the pipeline ending",
        )
        assert done["state"] == "succeeded", cluster.logs()
        decode = next(j for j in done["jobs"] if j["pipeline"]["step"] == "decode")
        digest = http.get(f"/v1/jobs/{decode['id']}/result/digest.txt").text
    want = hashlib.sha256(bytes(range(256)) * (SIZE // 256)).hexdigest()
    assert digest == f"in.bin {want}"
    agent.wait_for("input in.bin is a result made here: no transfer")
