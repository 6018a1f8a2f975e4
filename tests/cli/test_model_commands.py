"""``corral model add|ls|rm`` and the SDK's model methods against a real ``corral server``.

Uploads go through the server's real body limit (4 MiB), so a 9 MiB file
takes three chunks; an upload cut off after its first chunk is resumed by
running the same command again.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from pathlib import Path

import httpx
from cli_runner import Cli
from live_server import Running

from corral.sdk import Client
from corral.sdk.registry import UploadProgress

MIB = 1024 * 1024


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_add_list_and_remove_a_url_model(cli: Cli, server: Running) -> None:
    cli = cli.against(server)
    model = name("sdxl")
    sha = hashlib.sha256(b"x").hexdigest()
    added = cli(
        "model", "add", model, "--source", "https://models.example/sdxl.safetensors",
        "--size", "6.5GiB", "--sha256", sha, "--backend", "a1111", "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    info = json.loads(added.stdout)
    assert (info["size"], info["state"], info["backend"]) == (int(6.5 * 1024**3), "ready", "a1111")
    table = cli("model", "ls").stdout
    assert model in table
    assert "6.5 GiB" in table
    assert model in [m["name"] for m in json.loads(cli("models", "--json").stdout)]
    assert cli("model", "rm", model).exit_code == 0
    assert model not in cli("model", "ls").stdout
    gone = cli("model", "rm", model)
    assert gone.exit_code == 1
    assert model in gone.stderr


def test_bad_input_says_what_is_wrong(cli: Cli, server: Running) -> None:
    cli = cli.against(server)
    nothing = cli("model", "add", name("m"))
    assert nothing.exit_code == 2
    assert "--source" in nothing.stderr
    bad_sha = cli("model", "add", name("m"), "--source", "https://x.example/m", "--size", "1",
                  "--sha256", "xyz")  # fmt: skip
    assert bad_sha.exit_code == 2
    assert "sha256" in bad_sha.stderr


def test_a_file_upload_cut_off_is_resumed_by_running_the_command_again(
    cli: Cli, server: Running, tmp_path: Path
) -> None:
    data = random.Random(5).randbytes(9 * MIB + 17)
    path = tmp_path / "dreambooth.safetensors"
    path.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    model = name("dreambooth")
    admin = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=admin, timeout=30) as http:
        body = {"sources": ["upload"], "size": len(data), "sha256": sha}
        assert http.put(f"/v1/models/{model}", json=body).status_code == 201
        first = http.put(
            f"/v1/models/{model}/upload",
            content=data[: 4 * MIB],
            headers={"Content-Range": f"bytes 0-{4 * MIB - 1}/{len(data)}"},
        )
        assert first.json()["received"] == 4 * MIB  # ... and then the connection died
    seen: list[UploadProgress] = []
    with Client(server.url, server.token) as client:
        info = client.add_model(model, file=str(path), progress=seen.append)
        assert (info.state, info.uploaded, info.sha256) == ("ready", len(data), sha)
        sent = [p.done for p in seen if p.phase == "uploading"]
        assert sent == [8 * MIB, len(data)]  # it went on from 4 MiB: nothing sent twice
        assert client.download(f"/v1/models/{model}/file") == data
    again = cli.against(server)("model", "add", model, "--file", str(path), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["state"] == "ready"
