"""The model registry publishes only what it should (issue 45, item 8).

Every token can download what the registry names, so an admin token (or a
stolen one) must not be able to publish the server's own files, and agents
must not be sent to private addresses such as the cloud metadata service.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from http_harness import Served, serve
from process_harness import ServerProcess

pytestmark = pytest.mark.anyio
SHA = "ab" * 32


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(str(tmp_path / "corral.db"), tmp_path) as s:
        yield s


async def team_client(served: Served) -> httpx.AsyncClient:
    body = {"kind": "team", "name": "t", "team": "red"}
    token = (await served.admin.post("/v1/tokens", json=body)).json()["token"]
    return served.client(token)


async def test_a_server_file_outside_the_model_directory_is_not_published(
    served: Served, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    (models / "passwd-link").symlink_to("/etc/passwd")
    outside = [
        "file:///etc/passwd",
        "/etc/passwd",
        f"{models}/../../../../etc/passwd",
        f"{models}/passwd-link",  # a symlink in the model directory to /etc/passwd
    ]
    async with await team_client(served) as team:
        for source in outside:
            reply = await served.admin.put("/v1/models/x", json={"sources": [source]})
            assert reply.status_code == 422, (source, reply.text)
            assert reply.json()["field"] == "sources[0]"
            assert "models.file_dirs" in reply.json()["message"]
            assert (await team.get("/v1/models/x/file")).status_code == 404


async def test_a_file_swapped_for_a_symlink_after_registration_is_not_served(
    served: Served, tmp_path: Path
) -> None:
    model = tmp_path / "models" / "m.bin"
    model.parent.mkdir(exist_ok=True)
    model.write_bytes(b"weights")
    assert (await served.admin.put("/v1/models/m", json={"sources": [str(model)]})).is_success
    model.unlink()
    model.symlink_to("/etc/passwd")
    async with await team_client(served) as team:
        reply = await team.get("/v1/models/m/file")
    assert reply.status_code == 403, reply.text
    assert b"root:" not in reply.content
    assert "models.file_dirs" in reply.json()["message"]


PRIVATE_URLS = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://127.0.0.1:8470/v1/tokens",
    "http://localhost/x",
    "http://[::1]/x",
    "http://[::ffff:169.254.169.254]/x",
    "http://[64:ff9b::a9fe:a9fe]/x",  # NAT64 for 169.254.169.254
    "http://2852039166/x",  # 169.254.169.254 as one number
    "http://0x7f.1/x",  # 127.0.0.1, as the resolver reads it
    "https://10.0.0.5/x",
    "https://192.168.1.2/x",
    "https://100.64.0.1/x",  # carrier-grade NAT
    "http://0.0.0.0/x",
]


async def test_a_private_or_link_local_url_is_refused(served: Served) -> None:
    for url in PRIVATE_URLS:
        body = {"sources": [url], "size": 10, "sha256": SHA}
        reply = await served.admin.put("/v1/models/x", json=body)
        assert reply.status_code == 422, (url, reply.text)
        assert reply.json()["field"] == "sources[0]"
        assert "models.allowed_networks" in reply.json()["message"]


async def test_public_and_agent_side_hosts_are_accepted(served: Served) -> None:
    """A public address; a name the server cannot resolve is left to the agents' network."""
    for i, url in enumerate(["https://93.184.216.34/m", "https://models.example/m"]):
        body = {"sources": [url], "size": 10, "sha256": SHA}
        assert (await served.admin.put(f"/v1/models/x{i}", json=body)).status_code == 201


@pytest.mark.slow
async def test_schemes_directories_and_networks_are_configured(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "a.bin").write_bytes(b"a")
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "models" / "b.bin").write_bytes(b"b")
    env = {
        "CORRAL_MODELS__SOURCE_SCHEMES": json.dumps(["https", "file"]),
        "CORRAL_MODELS__FILE_DIRS": json.dumps([str(shared)]),
        "CORRAL_MODELS__ALLOWED_NETWORKS": json.dumps(["10.0.0.0/8"]),
    }
    proc = ServerProcess(str(tmp_path / "corral.db"), tmp_path, env=env).start()
    try:
        headers = {"Authorization": f"Bearer {proc.admin_token}"}
        async with httpx.AsyncClient(base_url=proc.url, headers=headers, timeout=10) as admin:
            cases = [
                ("https://10.1.2.3/m", 201, None),
                ("https://192.168.1.2/m", 422, "models.allowed_networks"),
                ("http://93.184.216.34/m", 422, "models.source_schemes"),
                (str(shared / "a.bin"), 201, None),
                (str(tmp_path / "models" / "b.bin"), 422, "models.file_dirs"),
                ("upload", 201, None),
            ]
            for i, (source, want, setting) in enumerate(cases):
                sha = hashlib.sha256(b"a").hexdigest()
                body = {"sources": [source], "size": 1, "sha256": sha}
                reply = await admin.put(f"/v1/models/m{i}", json=body)
                assert reply.status_code == want, (source, reply.text)
                if setting is not None:
                    assert setting in reply.json()["message"], reply.text
    finally:
        proc.stop()
