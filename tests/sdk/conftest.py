"""Fixtures: a real ``corral server`` process, a stub-agent server process, clients, a proxy.

The two servers start once per session (about a second each); tests keep
out of each other's way by submitting under a team of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from flaky_proxy import FlakyProxy
from live_server import FAST_RETRY, Running, corral_server, stub_server

from corral.sdk import Client


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """``corral server`` with no agents: jobs stay queued."""
    with corral_server(tmp_path_factory.mktemp("corral-server")) as running:
        yield running


@pytest.fixture(scope="session")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A server process with two stub agents that run jobs as their payload says."""
    with stub_server(tmp_path_factory.mktemp("stub-server")) as running:
        yield running


@pytest.fixture
def team() -> str:
    """A team of this test's own, so shared servers do not mix tests' jobs."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def admin(server: Running) -> Iterator[Client]:
    with Client(server.url, server.token, retry=FAST_RETRY) as client:
        yield client


@pytest.fixture
def runner_client(stub: Running) -> Iterator[Client]:
    with Client(stub.url, stub.token, retry=FAST_RETRY) as client:
        yield client


@pytest.fixture
def make_proxy() -> Iterator[Callable[[int], FlakyProxy]]:
    """Proxies in front of a server port, closed after the test."""
    made: list[FlakyProxy] = []

    def make(port: int) -> FlakyProxy:
        made.append(FlakyProxy(port))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A file path a stub job waits for (``payload={"gate": str(gate)}``); touch it to go on."""
    return tmp_path / "go"
