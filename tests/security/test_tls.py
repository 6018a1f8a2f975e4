"""TLS end to end: a server that makes its own certificate, agents and clients that pin it.

One real ``corral server --tls self-signed`` process (loopback) serves both
ports with the certificate it made at first start. An agent given the join
string from ``POST /v1/tokens`` (the token with the certificate's
fingerprint) dials ``grpcs://``, runs a job and fetches the job's model
from the server over https under the same pin; an agent or client pinned to
another fingerprint is refused before it sends its token, naming both
fingerprints; plain http to the TLS port gets nowhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from e2e_harness import ADMIN, CLI, Proc

from corral.sdk import AsyncClient, Client, ServerUnreachable, UntrustedServer
from corral.server.app import create_plane
from corral.server.settings import Settings
from corral.server.tls import server_tls

pytestmark = pytest.mark.slow
WRONG = "sha256:" + "ab" * 32
QUICK = {"steps": 2, "step_s": 0.02, "preview_every": 0}
MODEL = b"corral-tls-test-model" * 3000


@dataclass
class TlsServer:
    proc: Proc
    home: Path
    url: str  # https://127.0.0.1:PORT
    agents: str  # grpcs://127.0.0.1:PORT
    fingerprint: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    home = tmp_path_factory.mktemp("tls-server")
    argv = [sys.executable, "-c", CLI, "server", "--home", str(home), "--tls", "self-signed"]
    argv += ["--port", "0", "--agent-port", "0", "--log-level", "warning"]
    proc = Proc("server", argv, _env({"CORRAL_ADMIN_TOKEN": ADMIN}))
    try:
        url = proc.wait_for(r"listening on (https://\S+)").group(1)
        fingerprint = proc.wait_for(r"fingerprint: (sha256:[0-9a-f]{64})").group(1)
        agents = proc.wait_for(r"--server (grpcs://\S+)").group(1)
        proc.wait_for(r"admin token|database:")
        yield TlsServer(proc, home, url, agents, fingerprint)
    finally:
        proc.stop()
        print(proc.log())


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    keep = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return keep | {"PYTHONUNBUFFERED": "1"} | extra


def _agent(server: TlsServer, tmp: Path, name: str, *join: str) -> Proc:
    argv = [sys.executable, "-c", CLI, "agent", "--server", server.agents, "--name", name]
    argv += ["--work-dir", str(tmp / name), "--cpus", "1", *join]
    return Proc(f"agent {name}", argv, _env({}))


def test_the_certificate_is_made_at_first_start_and_kept_owner_only(server: TlsServer) -> None:
    folder = server.home / "tls"
    cert, key = folder / "server.crt", folder / "server.key"
    der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    assert server.fingerprint == "sha256:" + hashlib.sha256(der).hexdigest()
    assert key.stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    again = server_tls(Settings(home=server.home, tls={"mode": "self-signed"}))  # type: ignore[arg-type]
    assert again is not None
    assert again.fingerprint == server.fingerprint  # kept: agents' pins stay valid
    assert not again.made


@pytest.mark.parametrize(
    ("host", "mode", "want_tls"),
    [
        pytest.param("127.0.0.1", "auto", False, id="loopback-stays-plain-http"),
        pytest.param("0.0.0.0", "auto", True, id="every-address-gets-tls"),
        pytest.param("192.0.2.7", "auto", True, id="a-public-address-gets-tls"),
        pytest.param("0.0.0.0", "off", False, id="off-behind-a-proxy"),
        pytest.param("127.0.0.1", "self-signed", True, id="asked-for-on-loopback"),
    ],
)
def test_tls_is_on_wherever_the_server_listens_beyond_this_machine(
    tmp_path: Path, host: str, mode: str, want_tls: bool
) -> None:
    settings = Settings(home=tmp_path, api={"host": host}, tls={"mode": mode})  # type: ignore[arg-type]
    assert (server_tls(settings) is not None) == want_tls


def test_an_agent_joining_with_the_pinned_join_string_runs_a_job_and_fetches_its_model(
    server: TlsServer, tmp_path: Path
) -> None:
    model = tmp_path / "tiny.safetensors"
    model.write_bytes(MODEL)
    with Client(server.url, ADMIN, ca_fingerprint=server.fingerprint) as sdk:
        token = sdk.create_token("agent", "tls-agent")
        assert token.join == f"{server.fingerprint}::{token.token}"
        assert token.join_command is not None
        assert f"--join {token.join}" in token.join_command
        assert token.join_command.startswith("corral agent --server grpcs://127.0.0.1:")
        sdk.add_model("tiny", file=str(model))  # served by the server itself, over https
        agent = _agent(server, tmp_path, "pinned", "--join", token.join)
        try:
            agent.wait_for(r"connected to grpcs://", timeout=30)
            job = sdk.submit(kind="sample", model="tiny", payload=QUICK)
            status = job.wait(timeout=60)
            assert status.state == "succeeded", agent.log()
            assert status.node == "pinned"
        finally:
            agent.stop()


def test_an_agent_pinned_to_another_certificate_is_refused_naming_both(
    server: TlsServer, tmp_path: Path
) -> None:
    argv = [sys.executable, "-c", CLI, "agent", "--server", server.agents, "--name", "mitm"]
    argv += ["--work-dir", str(tmp_path / "mitm"), "--token", ADMIN, "--ca-fingerprint", WRONG]
    out = subprocess.run(argv, env=_env({}), capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert f"but the pin expects {WRONG}" in out.stderr
    assert f"fingerprint {server.fingerprint}" in out.stderr
    with Client(server.url, ADMIN, ca_fingerprint=server.fingerprint) as sdk:
        assert "mitm" not in [n.name for n in sdk.nodes()]


def test_the_sdk_talks_https_only_to_the_pinned_certificate(server: TlsServer) -> None:
    with Client(server.url, ADMIN, ca_fingerprint=server.fingerprint) as sdk:
        assert sdk.health()["status"] == "ok"
    wrong = Client(server.url, ADMIN, ca_fingerprint=WRONG)
    with wrong, pytest.raises(UntrustedServer, match=server.fingerprint):
        wrong.health()
    unpinned = Client(server.url, ADMIN)  # the system's CAs do not vouch for it
    with unpinned, pytest.raises(ServerUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        unpinned.health()
    assert asyncio.run(_async_health(server.url, server.fingerprint))["status"] == "ok"
    with pytest.raises(UntrustedServer, match=server.fingerprint):
        asyncio.run(_async_health(server.url, WRONG))
    cert = str(server.home / "tls" / "server.crt")  # the CA-file way: names are checked
    with Client(server.url.replace("127.0.0.1", "localhost"), ADMIN, ca_cert=cert) as sdk:
        assert sdk.health()["status"] == "ok"


async def _async_health(url: str, fingerprint: str) -> dict[str, Any]:
    async with AsyncClient(url, ADMIN, ca_fingerprint=fingerprint) as sdk:
        return await sdk.health()


def test_plain_http_to_the_tls_port_gets_no_answer(server: TlsServer) -> None:
    plain = server.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/healthz", timeout=5)


def test_the_cli_logs_in_to_the_https_server_with_the_pin(
    server: TlsServer, tmp_path: Path
) -> None:
    env = _env({"CORRAL_CONFIG": str(tmp_path / "config.toml")})
    login = [sys.executable, "-c", CLI, "login", server.url, "--token", ADMIN]
    done = subprocess.run(
        [*login, "--ca-fingerprint", server.fingerprint],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert server.fingerprint in (tmp_path / "config.toml").read_text()
    nodes = [sys.executable, "-c", CLI, "nodes"]
    done = subprocess.run(nodes, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # the saved pin is used by every command


def test_machines_the_autoscaler_launches_join_with_the_pin(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: a, cpus: 2}\n")
    settings = Settings(
        home=tmp_path,
        tls={"mode": "self-signed"},  # type: ignore[arg-type]
        autoscale={"pools_file": pools, "command": "true"},  # type: ignore[arg-type]
    )
    plane = create_plane(settings)
    assert plane.tls is not None
    assert plane.autoscale is not None
    assert (
        plane.autoscale.join_token("corral_agent_x") == f"{plane.tls.fingerprint}::corral_agent_x"
    )
