"""examples/autoscale/local_provider.py, driven by the command provider with a fake ``corral``.

``CORRAL_BIN`` points at a tiny program that records its argv and token, then
sleeps like an agent, so no server is needed; the example's own process checks
(``process_alive``) tell whether it still runs.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from corral.autoscaler import Join, Pool
from corral.autoscaler.testing import check_provider
from corral.server.providers import CommandProvider

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parents[2] / "examples" / "autoscale" / "local_provider.py"
JOIN = Join("grpc://127.0.0.1:8471", "corral_agent_local-test")
GiB = 1024**3

FAKE_AGENT = """\
import json, os, signal, sys, time
name = sys.argv[sys.argv.index("--name") + 1]
if os.environ.get("FAKE_AGENT_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("fake agent", name, "up", flush=True)
record = {"argv": sys.argv[1:], "token": os.environ.get("CORRAL_AGENT_TOKEN")}
path = os.path.join(os.environ["FAKE_AGENT_OUT"], name + ".json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
time.sleep(120)
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The provider's state dir, with CORRAL_BIN set to the fake agent."""
    fake = tmp_path / "fake_corral.py"
    fake.write_text(FAKE_AGENT)
    (tmp_path / "out").mkdir()
    monkeypatch.setenv("CORRAL_LOCAL_PROVIDER_DIR", str(tmp_path / "provider"))
    monkeypatch.setenv("CORRAL_BIN", shlex.join([sys.executable, str(fake)]))
    monkeypatch.setenv("FAKE_AGENT_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("CORRAL_LOCAL_PROVIDER_GRACE_S", "0.5")
    return tmp_path


@pytest.fixture
def provider(home: Path) -> CommandProvider:
    return CommandProvider([sys.executable, str(EXAMPLE)], timeout_s=30)


async def test_local_provider_conforms(provider: CommandProvider) -> None:
    await check_provider(provider)


async def test_launch_starts_agents_with_the_pool_shape(
    home: Path, provider: CommandProvider
) -> None:
    pool = Pool("a", gpus=2, gpu_model="RTX 4090", vram_bytes=24 * GiB, cpus=8, labels={"z": "1"})
    await provider.launch(pool, ["m-1"], JOIN, request_id="r-1")
    try:
        got = json.loads(await eventually_read(home / "out" / "m-1.json"))
        assert got["argv"] == [
            "agent",
            "--server",
            "grpc://127.0.0.1:8471",
            "--name",
            "m-1",
            "--work-dir",
            str(home / "provider" / "work" / "m-1"),
            "--cpus",
            "8",
            "--fake-gpus",
            "2x RTX 4090 24GiB",
            "--label",
            "z=1",
        ]
        assert got["token"] == JOIN.token, "the token goes in CORRAL_AGENT_TOKEN, not argv"
        assert [(m.name, m.pool) for m in await provider.members()] == [("m-1", "a")]
        log = (home / "provider" / "logs" / "m-1.log").read_text()
        assert "fake agent m-1 up" in log
    finally:
        await provider.terminate(["m-1"])
    assert await provider.members() == []


async def test_cpu_pool_gets_no_fake_gpus(home: Path, provider: CommandProvider) -> None:
    await provider.launch(Pool("cpu", cpus=2), ["c-1"], JOIN, request_id="r-1")
    try:
        got = json.loads(await eventually_read(home / "out" / "c-1.json"))
        assert "--fake-gpus" not in got["argv"]
    finally:
        await provider.terminate(["c-1"])


async def test_terminate_kills_an_agent_that_ignores_sigterm(
    home: Path, provider: CommandProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_AGENT_IGNORE_TERM", "1")
    await provider.launch(Pool("cpu"), ["s-1"], JOIN, request_id="r-1")
    await eventually_read(home / "out" / "s-1.json")  # it has set its handler
    pid = json.loads((home / "provider" / "members" / "s-1.json").read_text())["pid"]
    await provider.terminate(["s-1"])
    assert not example().process_alive(pid, "s-1")
    assert await provider.members() == []


def test_sizes_are_written_exactly() -> None:
    size_text = example().size_text
    assert size_text(24 * GiB) == "24GiB"
    assert size_text(1536 * 1024**2) == "1536MiB"


async def eventually_read(path: Path, timeout_s: float = 10.0) -> str:
    """The file's text once the fake agent has written it (it starts in the background)."""
    with anyio.fail_after(timeout_s):
        while not path.exists():
            await anyio.sleep(0.02)
    return path.read_text()


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("local_provider", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
