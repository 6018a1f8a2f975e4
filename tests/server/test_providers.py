"""The providers: every one passes the conformance suite, and every failure says what failed.

The command provider runs a real program (``provider_script.py``) and the
webhook provider talks to a real HTTP server on a loopback socket.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from corral.autoscaler import Join, Pool, Provider, ProviderError, SimulatedProvider
from corral.autoscaler.testing import POOL_A, check_provider
from corral.server.providers import (
    CommandProvider,
    WebhookProvider,
    members_from_json,
    pool_to_json,
)

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).with_name("provider_script.py")
TOKEN = "corral_provider_test-token"
JOIN = Join("grpc://10.0.0.1:8471", "corral_agent_join")


def py(code: str) -> list[str]:
    """A command provider that runs ``code`` (its subcommand is sys.argv[1])."""
    return [sys.executable, "-c", code]


# ---- conformance -------------------------------------------------------------------------


async def test_simulated_provider_conforms() -> None:
    await check_provider(SimulatedProvider(now=lambda: 1000.0))


async def test_command_provider_conforms(tmp_path: Path) -> None:
    provider = CommandProvider([sys.executable, str(SCRIPT), str(tmp_path / "state.json")])
    assert isinstance(provider, Provider)
    await check_provider(provider)


async def test_webhook_provider_conforms(webhook: Webhook) -> None:
    provider = WebhookProvider(webhook.url, token=TOKEN)
    assert isinstance(provider, Provider)
    try:
        await check_provider(provider)
    finally:
        await provider.aclose()
    assert webhook.actions >= {"list", "launch", "terminate"}


# ---- what the providers send -------------------------------------------------------------


async def test_command_launch_passes_pool_names_and_join(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    provider = CommandProvider(f"{sys.executable} {SCRIPT} {state}")  # a string is split
    await provider.launch(POOL_A, ["n-1", "n-2"], JOIN, request_id="r-1")
    sent = json.loads(state.read_text())["last_launch"]
    assert sent == {
        "pool": pool_to_json(POOL_A),
        "names": ["n-1", "n-2"],
        "server": "grpc://10.0.0.1:8471",
        "token": "corral_agent_join",
        "request_id": "r-1",
    }
    assert sent["pool"]["backends"] == ["python"]
    assert sent["pool"]["labels"] == {"zone": "test"}


async def test_webhook_launch_sends_action_and_bearer(webhook: Webhook) -> None:
    provider = WebhookProvider(webhook.url, token=TOKEN)
    try:
        await provider.launch(POOL_A, ["w-1"], JOIN, request_id="r-1")
    finally:
        await provider.aclose()
    assert webhook.last == {
        "action": "launch",
        "pool": pool_to_json(POOL_A),
        "names": ["w-1"],
        "server": JOIN.server,
        "token": JOIN.token,
        "request_id": "r-1",
    }


async def test_members_without_launched_at_keep_the_time_first_seen() -> None:
    clock = iter([100.0, 200.0])
    code = 'import json; print(json.dumps({"members": [{"name": "m-1", "pool": "a"}]}))'
    provider = CommandProvider(py(code), now=lambda: next(clock))
    first, second = await provider.members(), await provider.members()
    assert first[0].launched_at == second[0].launched_at == 100.0


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        pytest.param([], "expected an object", id="not-an-object"),
        pytest.param({}, "members missing", id="no-members"),
        pytest.param({"members": [{"name": "a"}]}, "members[0].pool missing", id="no-pool"),
        pytest.param(
            {"members": [{"name": "a", "pool": "p"}, {"name": "b", "pool": 3}]},
            "members[1].pool must be a non-empty string",
            id="pool-not-a-string",
        ),
        pytest.param(
            {"members": [{"name": "a", "pool": "p", "launched_at": "yesterday"}]},
            "members[0].launched_at must be unix seconds",
            id="bad-time",
        ),
        pytest.param(
            {"members": [{"name": "a", "pool": "p"}, {"name": "a", "pool": "p"}]},
            "names listed twice: a",
            id="duplicate",
        ),
    ],
)
def test_members_from_json_names_the_bad_field(answer: object, want: str) -> None:
    with pytest.raises(ValueError, match=re.escape(want)):
        members_from_json(answer)


# ---- command failures --------------------------------------------------------------------


async def test_command_exit_code_and_stderr_are_reported() -> None:
    code = "import sys; sys.stderr.write('x' * 2000 + 'boom'); sys.exit(3)"
    provider = CommandProvider(py(code))
    with pytest.raises(ProviderError) as caught:
        await provider.launch(POOL_A, ["n-1"], JOIN, request_id="r-1")
    text = str(caught.value)
    assert text.startswith("command provider launch: ")
    assert "exited with code 3" in text
    assert text.endswith("boom")
    assert len(text) < 700, "only the tail of stderr is kept"


async def test_command_timeout_kills_the_process(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    provider = CommandProvider(py(code), timeout_s=0.5)
    with pytest.raises(ProviderError, match=r"within the 0.5s timeout"):
        await provider.terminate(["n-1"])
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_command_malformed_list_names_the_field() -> None:
    code = 'print(\'{"members": [{"name": "a", "pool": "p"}, {"name": "b"}]}\')'
    with pytest.raises(ProviderError, match=r"list: members\[1\]\.pool missing"):
        await CommandProvider(py(code)).members()


async def test_command_list_that_is_not_json() -> None:
    with pytest.raises(ProviderError, match=r"list: stdout is not JSON.*'hello'"):
        await CommandProvider(py("print('hello')")).members()


async def test_command_missing_executable(tmp_path: Path) -> None:
    provider = CommandProvider(str(tmp_path / "no-such-provider"))
    with pytest.raises(ProviderError, match=r"list: cannot run .*no-such-provider.*no such file"):
        await provider.members()


def test_command_must_name_an_executable() -> None:
    with pytest.raises(ValueError, match=r"autoscale\.command"):
        CommandProvider("  ")


# ---- webhook failures --------------------------------------------------------------------


async def test_webhook_server_error_names_the_status(webhook: Webhook) -> None:
    webhook.fail = 500
    provider = WebhookProvider(webhook.url, token=TOKEN)
    try:
        with pytest.raises(ProviderError, match=r"webhook launch: .* HTTP 500 .*quota exceeded"):
            await provider.launch(POOL_A, ["w-1"], JOIN, request_id="r-1")
    finally:
        await provider.aclose()


async def test_webhook_wrong_token_is_refused(webhook: Webhook) -> None:
    provider = WebhookProvider(webhook.url, token="wrong")
    try:
        with pytest.raises(ProviderError, match=r"webhook list: .* HTTP 401"):
            await provider.members()
    finally:
        await provider.aclose()


async def test_webhook_malformed_list_names_the_field(webhook: Webhook) -> None:
    webhook.members["bad"] = {"name": "bad"}
    provider = WebhookProvider(webhook.url, token=TOKEN)
    try:
        with pytest.raises(ProviderError, match=r"webhook list: members\[0\]\.pool missing"):
            await provider.members()
    finally:
        await provider.aclose()


async def test_webhook_down_is_a_provider_error() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nobody listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = WebhookProvider(f"http://127.0.0.1:{port}/provider", token=TOKEN)
    try:
        with pytest.raises(ProviderError, match=r"webhook terminate: .* cannot be reached"):
            await provider.terminate(["w-1"])
    finally:
        await provider.aclose()


def test_webhook_needs_an_http_url() -> None:
    with pytest.raises(ValueError, match=r"autoscale\.webhook"):
        WebhookProvider("ftp://example.com/x")


def test_pool_to_json_is_plain_json() -> None:
    pool = Pool("p", gpus=1, vram_bytes=8, labels={"b": "2", "a": "1"}, backends=frozenset("yx"))
    assert json.loads(json.dumps(pool_to_json(pool)))["backends"] == ["x", "y"]
    assert list(pool_to_json(pool)["labels"]) == ["a", "b"]


# ---- a real webhook server ---------------------------------------------------------------


@dataclass
class Webhook:
    """A provider webhook in memory, served on a loopback socket by a thread."""

    url: str = ""
    members: dict[str, dict[str, Any]] = field(default_factory=dict)
    actions: set[str] = field(default_factory=set)
    last: dict[str, Any] | None = None
    fail: int | None = None  # answer every request with this status
    requests: set[str] = field(default_factory=set)  # launch request ids seen

    def answer(self, auth: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if auth != f"Bearer {TOKEN}":
            return 401, {"error": "bad token"}
        if self.fail:
            return self.fail, {"error": "quota exceeded"}
        self.last, action = body, body["action"]
        self.actions.add(action)
        if action == "launch" and body["request_id"] not in self.requests:
            self.requests.add(body["request_id"])
            for name in body["names"]:
                self.members[name] = {"name": name, "pool": body["pool"]["name"]}
        elif action == "terminate":
            for name in body["names"]:
                self.members.pop(name, None)
        return 200, {"members": list(self.members.values())} if action == "list" else {}


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    state = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, reply = state.answer(self.headers.get("Authorization"), body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/corral/provider"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
