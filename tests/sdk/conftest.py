"""Fixtures: a real ``corral server`` process, a stub-agent server process, clients, a proxy.

The servers and the per-test team come from ``live_fixtures.py`` (shared with the CLI tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import live_fixtures
import pytest
from flaky_proxy import FlakyProxy
from live_server import FAST_RETRY, Running

from corral.sdk import Client


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


server, stub, team = live_fixtures.server, live_fixtures.stub, live_fixtures.team  # shared fixtures
